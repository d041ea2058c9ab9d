"""Worker process for the llama-cpp-python comparison arm (see external.py); run as a script, never imported.

It must not import pyllamaspec: two copies of llama.cpp in one process would share symbols and the GPU.
Protocol, one JSON object per line: it prints {"ready": true} once the model is loaded; then for each request
{"tokens": [...], "n_predict": N} it prints {"tokens": [...], "tokens_per_second": x}, or {"error": "..."}.
"""

import argparse
import json
import os
import sys
import time


def decode(llm, prompt_tokens, n_predict):
    tokens, stamps = [], []
    for token in llm.generate(prompt_tokens, temp=0.0, reset=True):
        stamps.append(time.perf_counter())
        tokens.append(token)
        if token == llm.token_eos() or len(tokens) >= n_predict:
            break
    # the first token comes out of the prompt's forward pass; decode speed is over the tokens after it
    speed = (len(tokens) - 1) / (stamps[-1] - stamps[0]) if len(tokens) > 1 else 0.0
    return {"tokens": tokens, "tokens_per_second": speed}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--n-ctx", type=int, required=True)
    parser.add_argument("--n-gpu-layers", type=int, default=-1)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    # the protocol gets its own copy of stdout; anything the native library prints goes to the log on stderr
    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def reply(message):
        protocol.write(json.dumps(message) + "\n")
        protocol.flush()

    try:
        from llama_cpp import Llama

        llm = Llama(model_path=args.model, n_ctx=args.n_ctx, n_gpu_layers=args.n_gpu_layers,
                    n_threads=args.threads, seed=args.seed, verbose=False)
    except Exception as error:  # report any load failure to the harness rather than dying silently
        reply({"error": f"loading {args.model}: {error}"})
        return 1
    reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reply(decode(llm, request["tokens"], request["n_predict"]))
        except Exception as error:
            reply({"error": str(error)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
