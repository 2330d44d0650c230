"""Runs vLLM's OpenAI server so that it dies with the process that started it.

Started by `server.VLLMServer` with the vLLM environment's interpreter, by path (that
environment does not have `art` installed), with `-P` so that this file's folder, whose
`tokenize.py` would shadow the standard library's, is not on `sys.path`. It uses the
standard library only. It
leads its own process group, in which vLLM starts its engine and worker processes, and
holds its stdin: the parent keeps the other end open for as long as it lives. When the
parent exits, even by SIGKILL, stdin reaches end of file and the whole group is ended.

    python -P launcher.py <vLLM server arguments>
"""

import os
import runpy
import signal
import threading
import time


def _end_group_when_parent_exits() -> None:
    while os.read(0, 1):  # unbuffered: no lock left held at the interpreter's exit
        pass
    os.killpg(0, signal.SIGTERM)  # vLLM shuts its engine down on SIGTERM
    time.sleep(20)
    os.killpg(0, signal.SIGKILL)


if __name__ == "__main__":
    threading.Thread(target=_end_group_when_parent_exits, daemon=True).start()
    # vLLM parses sys.argv[1:], our arguments; alter_sys points sys.argv[0] at its module.
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
