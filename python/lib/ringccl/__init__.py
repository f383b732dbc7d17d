"""ringccl as a torch.distributed backend.

After ``pip install``, any script can write::

    torch.distributed.init_process_group("ringccl")

(``import torch`` registers the backend through the ``torch.backends`` entry point), or
``init_process_group("cpu:ringccl,cuda:nccl")`` to keep CUDA tensors on NCCL.
"""

from ringccl._ringccl import __version__

__all__ = ["__version__", "register"]


_registering = False


def register():
    """Registers the "ringccl" backend with torch.distributed (idempotent)."""
    global _registering
    if _registering:  # torch's start-up came back here while the first call imports
        return
    _registering = True
    try:
        from ringccl._backend import register as _register

        _register()
    finally:
        _registering = False


def _autoload():
    """Called by ``import torch`` (the ``torch.backends`` entry point)."""
    try:
        register()
    except Exception as error:  # never break `import torch` for the user's other work
        import warnings

        warnings.warn(f"ringccl: could not register the torch.distributed backend: {error}")
