"""hpkv: set up and operate a three-tier KV cache (vLLM + LMCache + Curvine) on SageMaker HyperPod."""

__version__ = "0.1.0"
