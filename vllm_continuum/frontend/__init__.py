"""The API-server side of the plugin: what agent clients already send.

`ClientSessionMiddleware` (middleware.py, loaded with vLLM's `--middleware`)
reads the session ids and cache lifetimes that Claude Code, Codex,
OpenHands, LiteLLM and Dynamo clients send, and hands them to vLLM in its
own spellings (the `X-Session-ID` header, `vllm_xargs` hints). The parsing
(sessions.py, ttls.py, rewrite.py) imports neither vLLM nor the ASGI server,
so it is unit-tested on the recorded request shapes alone.
"""
