"""Inference backends: graphs exported from torch, converted, verified against torch, cached and run.

``registry`` names each backend as a value (file, agreement floors, base graph, precision, converter,
runtime); ``export`` turns a torch model into an ONNX graph and checks a graph against torch; ``runners``
run a graph (ONNX Runtime, OpenVINO); ``batching`` tokenises and packs texts; ``graphs`` finds a verified
graph in the cache or makes one.
"""
