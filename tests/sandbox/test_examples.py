"""Every example LIP runs through sandbox + worker and does what its docstring promises."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path

import pytest

import symphony as sy

pytestmark = [pytest.mark.integration, pytest.mark.docker, pytest.mark.vllm, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def run_example(lip_runner, name: str, args: dict, **kw):
    run = lip_runner.run(EXAMPLES / f"{name}.py", args, **kw)
    assert run.result.status == "succeeded", (run.result.error, run.result.stderr[-2000:])
    return run


def reference_greedy(worker, tokens_text: str, n: int) -> list[int]:
    """Plain greedy decoding through the SDK on the host (no fork, no rollback)."""
    with worker.session() as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            return s.generate(s.kv_create(), s.tokenize(tokens_text), n)
        finally:
            s.close()


def test_completion(lip_runner, gpu_worker_process) -> None:
    run = run_example(lip_runner, "completion", {"prompt": "The quick brown fox", "max_tokens": 12})
    assert run.result.result["tokens"] == reference_greedy(gpu_worker_process, "The quick brown fox", 12)
    assert run.session_end.usage["decode_tokens"] >= 11


def test_batch_completion_equals_each_prompt_alone(lip_runner, gpu_worker_process) -> None:
    prompts = ["The quick brown fox", "Water boils at", "One, two, three,"]
    run = run_example(lip_runner, "batch_completion", {"prompts": prompts, "max_tokens": 10})
    assert run.result.result["tokens"] == [reference_greedy(gpu_worker_process, p, 10) for p in prompts]


def test_parallel_fork_branches_equal_independent_decoding(lip_runner, gpu_worker_process) -> None:
    args = {"prefix": "Tell me a story about", "suffixes": [" a cat", " a dog", " the sea", " space"], "max_tokens": 6}
    run = run_example(lip_runner, "parallel_fork", args)
    branches = run.result.result["branches"]
    assert [b["suffix"] for b in branches] == args["suffixes"]
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        for b in branches:
            ids = s.tokenize(args["prefix"]) + s.tokenize(b["suffix"])
            assert b["tokens"] == s.generate(s.kv_create(), ids, 6), b
        s.close()


#: Prompts of the speculative example's check: a repetitive one (drafts get accepted) and
#: ordinary ones (drafts mostly rejected: rollback on nearly every step). In bf16 emulated on a
#: CPU, "The quick brown fox" diverged from greedy; the worker serves float32 there now.
SPECULATIVE_PROMPTS = (
    "one two three one two three one two",
    "The quick brown fox",
    "The capital of France is",
    "def fib(n):\n    return",
)


@pytest.mark.parametrize("prompt", SPECULATIVE_PROMPTS)
def test_speculative_rollback_equals_greedy(lip_runner, gpu_worker_process, prompt: str) -> None:
    run = run_example(lip_runner, "speculative", {"prompt": prompt, "max_tokens": 20, "k": 4})
    out = run.result.result
    assert out["tokens"] == reference_greedy(gpu_worker_process, prompt, 20), prompt
    if prompt == SPECULATIVE_PROMPTS[0]:
        # Drafts were accepted, so fewer forwards than tokens: rollback really happened and mattered.
        assert out["accepted_draft_tokens"] > 0
        assert out["forwards"] < len(out["tokens"])


def test_json_schema_output_parses(lip_runner) -> None:
    for seed in (0, 1):
        out = run_example(lip_runner, "json_output", {"question": "Is water wet?", "seed": seed}).result.result
        assert set(out) == {"answer", "confidence"}
        assert out["answer"] in ("yes", "no") and out["confidence"] in ("low", "medium", "high")
        json.dumps(out)


def test_rag_reuses_the_persistent_document_file(lip_runner, gpu_worker_process) -> None:
    tenant = f"rag-{uuid.uuid4().hex[:6]}"
    args = {
        "corpus": "cities",
        "documents": ["Paris is the capital of France.", "Rome is the capital of Italy."],
        "question": "What is the capital of Italy?",
        "max_tokens": 8,
    }
    first = run_example(lip_runner, "rag", args, tenant=tenant).result.result
    second = run_example(lip_runner, "rag", args, tenant=tenant).result.result
    assert (first["reused"], second["reused"]) == (False, True)
    assert first["tokens"] == second["tokens"]
    assert first["doc_tokens"] == second["doc_tokens"] > 10
    files = {(f["tenant"], f["name"]): f for f in gpu_worker_process.admin.kv_list(tenant)}
    assert files[(tenant, "docs-cities")]["pinned"] is True
    # Another tenant does not see it: its first run builds its own.
    other = run_example(lip_runner, "rag", args).result.result
    assert other["reused"] is False


def test_react_calls_a_tool_through_brokered_http(lip_runner) -> None:
    import http.server
    import threading

    calls: list[str] = []

    class Tool(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"] or 0)).decode()
            calls.append(body)
            data = json.dumps({"n": len(calls), "echo": body[:20]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Tool)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = {"tool_url": f"http://127.0.0.1:{port}/tool", "question": "What is 2+2?", "steps": 2}
        run = run_example(lip_runner, "react_tool", args, session_limits={"allowed_hosts": [f"127.0.0.1:{port}"]})
        out = run.result.result
        assert [o["n"] for o in out["observations"]] == [1, 2]
        assert len(calls) == 2
        # Without the allowlist entry the same program is refused by the worker.
        denied = lip_runner.run(EXAMPLES / "react_tool.py", args).result
        assert denied.status == "failed" and denied.error.startswith("PermissionDenied"), denied.error
        assert len(calls) == 2
    finally:
        server.shutdown()


def test_beam_search_scores_are_exact_and_width_one_is_greedy(lip_runner, gpu_worker_process) -> None:
    prompt = "The weather today is"
    greedy = run_example(lip_runner, "beam_search", {"prompt": prompt, "beams": 1, "max_tokens": 6})
    assert greedy.result.result["beams"][0]["tokens"] == reference_greedy(gpu_worker_process, prompt, 6)
    beams = run_example(lip_runner, "beam_search", {"prompt": prompt, "beams": 3, "max_tokens": 6})
    found = beams.result.result["beams"]
    assert len(found) == 3 and len({tuple(b["tokens"]) for b in found}) == 3
    assert [b["logprob"] for b in found] == sorted((b["logprob"] for b in found), reverse=True)
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        prompt_ids = s.tokenize(prompt)
        for beam in found:  # rescore each hypothesis from scratch in one multi-position pred
            ids = prompt_ids + beam["tokens"]
            rows = list(range(len(prompt_ids) - 1, len(ids) - 1))
            dists = s.pred(s.kv_create(), ids, positions=rows)
            total = sum(d.logprob([t])[0] for d, t in zip(dists, beam["tokens"], strict=True))
            assert total == pytest.approx(beam["logprob"], abs=1e-2), beam
        s.close()


def test_graph_of_thought_generates_scores_and_merges(lip_runner, gpu_worker_process) -> None:
    args = {
        "question": "Why is the sky blue?",
        "seeds": [" Because", " Light", " The sun"],
        "thought_tokens": 5,
        "final_tokens": 4,
    }
    run = run_example(lip_runner, "graph_of_thought", args)
    out = run.result.result
    assert len(out["thoughts"]) == 3 and len(set(out["chosen"])) == 2
    scores = [t["score"] for t in out["thoughts"]]
    assert scores[out["chosen"][0]] == max(scores)
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        question = s.tokenize(args["question"])
        for thought, seed in zip(out["thoughts"], args["seeds"], strict=True):
            assert thought["text"] == s.detokenize(s.generate(s.kv_create(), question + s.tokenize(seed), 5))
        chosen_seeds = [s.tokenize(args["seeds"][i]) for i in out["chosen"]]
        s.close()
    assert out["merged_tokens"] == len(question) + sum(len(seed) + 5 for seed in chosen_seeds)
    assert out["answer"]


def test_graph_of_thought_levels_build_on_the_refined_context(lip_runner, gpu_worker_process) -> None:
    """Two levels: the second level's thoughts fork the first level's merged and refined file,
    so its merged context is the first's plus the refine prompt, the refinement and its own
    best two thoughts; each level merges its two best-scored thoughts."""
    args = {
        "question": "Why is the sky blue?",
        "seeds": [" Because", " Light", " The sun", " Air"],
        "thought_tokens": 4,
        "final_tokens": 3,
        "levels": 2,
        "refine": " So",
    }
    out = run_example(lip_runner, "graph_of_thought", args).result.result
    first, second = out["levels"]
    for lv in (first, second):
        scores = [t["score"] for t in lv["thoughts"]]
        assert len(scores) == 4 and scores[lv["chosen"][0]] == max(scores)
        assert scores[lv["chosen"][1]] == max(s for i, s in enumerate(scores) if i != lv["chosen"][0])
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        seeds = [s.tokenize(seed) for seed in args["seeds"]]
        refine = s.tokenize(args["refine"])
        question = s.tokenize(args["question"])
        s.close()
    assert first["merged_tokens"] == len(question) + sum(len(seeds[i]) + 4 for i in first["chosen"])
    grown = len(refine) + 3 + sum(len(seeds[i]) + 4 for i in second["chosen"])
    assert second["merged_tokens"] == first["merged_tokens"] + grown
    assert out["merged_tokens"] == second["merged_tokens"] and out["answer"] == second["refined"]


def test_watermark_leans_green_and_its_detector_tells_it_apart(lip_runner, gpu_worker_process) -> None:
    """The same prompt and seeds with and without the green-list bias: the watermarked text is
    mostly green (half the vocabulary biased each step through a worker-side bias vector), the
    plain text about half, and the detector run on the host from the tokens alone agrees."""
    spec = importlib.util.spec_from_file_location("watermark_example", EXAMPLES / "watermark.py")
    assert spec is not None and spec.loader is not None
    watermark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watermark)
    args = {"prompt": "Once upon a time", "max_tokens": 64, "seed": 3}
    marked = run_example(lip_runner, "watermark", args).result.result
    plain = run_example(lip_runner, "watermark", {**args, "watermark": False}).result.result
    assert len(marked["tokens"]) >= 32 and len(plain["tokens"]) >= 32, (marked["text"], plain["text"])
    assert marked["green_fraction"] > 0.8 and marked["z"] > 4, marked
    assert plain["green_fraction"] < 0.7, plain
    with gpu_worker_process.session() as info:
        s = sy.connect(info.socket_path, info.token)
        try:
            vocab, last = s.info.vocab_size, s.tokenize(args["prompt"])[-1]
        finally:
            s.close()
    assert watermark.detect(marked["tokens"], vocab, 15485863, last) == (marked["green_fraction"], marked["z"])
