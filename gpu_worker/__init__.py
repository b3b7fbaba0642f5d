"""The per-GPU worker: engine adapter (vLLM), KVFS, two-level scheduler, socket server.

Must not import Django: the control plane talks to it only through its sockets and Redis.
"""
