"""Adapters for the frameworks and SDKs users already run (each an optional extra).

They sit on top of the library (beside ``marsys_mem.workflow``) and nothing in it imports
them, except the command line (``marsys-mem mcp``).
"""

__all__: list[str] = []
