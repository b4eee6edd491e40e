"""vmgpu: GPU sharing for virtual machines and containers through CUDA API remoting."""

__version__ = "0.1.0"
