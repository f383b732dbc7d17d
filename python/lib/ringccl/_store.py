"""What the backend needs to know about the store torch hands it."""

import socket


def _describe_store(store):
    """How torch's store is named in messages, and the address this host reaches it
    from (a TCPStore's), for listening to the peers."""
    inner = store
    while hasattr(inner, "underlying_store"):
        inner = inner.underlying_store
    kind = type(inner).__name__
    if kind == "TCPStore":
        host, port = inner.host, inner.port
        return f"torch's TCPStore at {host}:{port}", _route_to(host, port)
    return f"torch's {kind}", None


def _route_to(host, port):
    """The local address of the route to `host`: a UDP socket's connect picks it
    without sending anything."""
    try:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect(addr)
            return probe.getsockname()[0]
    except OSError:
        return None
