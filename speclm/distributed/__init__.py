"""speclm on Ray Serve (docs/distributed.md): an ingress deployment speaking the
server's OpenAI-compatible API (server/http.py) in front of engine replicas,
each holding one LLM and its batching engine, routed by tenant and prompt
prefix; the SSD speculator as a named actor on its own node.

Needs `pip install 'speclm[ray]'`; nothing else in speclm imports this package.
"""
