"""The defaults the Python API's signatures show (``retr.Index``, ``retr.evaluate``) and the configs they come
from, in one module that imports nothing: `import retr`, which every `retr` command runs first, then loads neither
numpy nor the search stack. The configs (the comment beside each value names its) take their defaults from here,
except the backend registry's, a layer below, which ``BACKEND`` repeats; tests/test_api.py checks every default of
the API's signatures against its config's."""

from __future__ import annotations

BACKEND = "openvino-int8"  # EncoderConfig.backend (retr.retrieval.backends.registry.DEFAULT_BACKEND)
DENSE_KIND = "flat"  # DenseIndexConfig.kind
USE_CACHE = True  # IndexConfig.use_cache
SHARDS = 1  # IndexConfig.shards
AGGREGATE = "maxp"  # PassageConfig.aggregate (retr.retrieval.passages.DEFAULT_AGGREGATE)
EXECUTOR = "local"  # ExecutorConfig.name
RAY_ACTORS = 2  # ExecutorConfig.actors
FUSION = "minmax"  # PipelineConfig.fusion (retr.retrieval.fusion.DEFAULT_FUSION)
FUSION_DEPTH = 100  # PipelineConfig.fusion_depth
RERANK_DEPTH = 20  # RerankConfig.depth (retr.retrieval.rerank_model.DEFAULT_RERANK_DEPTH)
K = 10  # retr.retrieval.request.DEFAULT_K
MODE = "hybrid"  # retr.retrieval.request.DEFAULT_MODE
PIPELINES = ("bm25", "dense", "hybrid")  # EvalConfig.pipelines (retr.eval.runner.DEFAULT_PIPELINES)
K_VALUES = (1, 3, 5, 10, 100, 1000)  # EvalConfig.k_values (retr.eval.metrics.DEFAULT_K_VALUES)
WARMUP = 5  # EvalConfig.warmup
