"""TCL: a transferable cost model for tensor-program optimization."""

__version__ = "0.1.0"
