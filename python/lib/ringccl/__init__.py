"""ringccl as a torch.distributed backend.

After ``pip install``, any script can write::

    torch.distributed.init_process_group("ringccl")

(``import torch`` registers the backend through the ``torch.backends`` entry point), or
``init_process_group("cpu:ringccl,cuda:nccl")`` to keep CUDA tensors on NCCL.
"""

from ringccl._ringccl import __version__

__all__ = ["__version__", "register"]


def register():
    """Registers the "ringccl" backend with torch.distributed (idempotent)."""
    from ringccl._backend import register as _register

    _register()


def _autoload():
    """Called by ``import torch`` (the ``torch.backends`` entry point)."""
    try:
        register()
    except Exception as error:  # never break `import torch` for the user's other work
        import warnings

        warnings.warn(f"ringccl: could not register the torch.distributed backend: {error}")
