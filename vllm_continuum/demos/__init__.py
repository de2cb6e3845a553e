"""The demos behind `vllm-continuum demo` and `vllm-continuum pause-demo`.

    agent_demo.py      `demo`: concurrent agent sessions through the agent service
    pause_demo.py      `pause-demo`: one tool-call pause, stock vLLM and continuum side by side
    pause_scenario.py  that pause as a client against a live server (also used by the tests)
"""
