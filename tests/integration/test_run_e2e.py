"""One run through the whole real stack, the way a tenant uses the service.

API key → REST upload of a LIP → ``POST /api/v1/runs`` → Celery ``run_lip`` (real broker, real
``celery worker`` process) → worker session on a real ``python -m gpu_worker`` serving the real
default model (SmolLM2-135M-Instruct, float32) → the LIP in a gVisor (runsc) container talking
over its session socket → tokens streamed over SSE from the ASGI server → result, usage and
billing rows in PostgreSQL. The generated tokens must equal greedy decoding by Hugging Face
transformers on the same weights.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ROOT, wait_for
from tests.integration.openai_support import openai_client
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
]

GREEDY_LIP = b"""
from symphony import apply_chat_template, detokenize, kv_create, pred, send_to_user, vocab_info


def main(args):
    eos = set(vocab_info().eos_token_ids)
    prompt = apply_chat_template([{"role": "user", "content": args["prompt"]}])
    kv = kv_create()
    dist = pred(kv, prompt)[-1]
    out = []
    for _ in range(args["max_tokens"]):
        tok = dist.argmax()
        if tok in eos:
            break
        out.append(tok)
        send_to_user(detokenize([tok]))
        dist = pred(kv, [tok])[-1]
    return {"prompt_ids": prompt, "ids": out, "text": detokenize(out)}
"""


@pytest.fixture(scope="module")
def stack_worker(shared_real_model_worker: RunningWorker) -> RunningWorker:
    """The worker on the real default model in float32 (so transformers can be matched exactly)."""
    return shared_real_model_worker


def _hf_greedy(model_dir: Path, prompt_ids: list[int], n: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, num_beams=1)
    return out[0, len(prompt_ids) :].tolist()


def test_run_through_api_celery_sandbox_and_worker(stack, stack_worker, api_tenant_a, default_model_dir, tmp_path):
    from symphony_client import Client

    lip = tmp_path / "greedy.py"
    lip.write_bytes(GREEDY_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="greedy")
    run = client.create_run(
        program["id"],
        args={"prompt": "What is the capital of France?", "max_tokens": 12},
        limits={"max_tokens": 512, "deadline_s": 120},
    )

    events = list(client.events(run["id"]))
    types = [e.type for e in events]
    assert types[-1] == "end", types
    final = client.get_run(run["id"])
    assert final["status"] == "succeeded", (final["error"], final.get("exit_code"))
    result = final["result"]

    streamed = "".join(e.data["text"] for e in events if e.type == "token")
    assert streamed == result["text"] and result["ids"], (streamed, result)
    assert "Paris" in result["text"], result["text"]
    assert result["ids"] == _hf_greedy(default_model_dir, result["prompt_ids"], len(result["ids"]))

    def billed() -> bool:
        days = client._call("GET", "usage")["days"]
        return any(d.get("decode_tokens", 0) >= len(result["ids"]) for d in days)

    wait_for(billed, timeout=30, message="usage of the run to be billed")
    from api.models import UsageRecord

    usage = UsageRecord.objects.get(run_id=run["id"])
    assert usage.prefill_tokens >= len(result["prompt_ids"])
    assert usage.pred_calls >= len(result["ids"])

    # Operators see the run in the Prometheus metrics: the worker's forwards (its heartbeat) and
    # the finished run (the database), scraped from loopback as a local Prometheus would.
    def scraped() -> dict[tuple[str, str], float]:
        text = httpx.get(f"{stack}/metrics", timeout=10).raise_for_status().text
        return {
            (s.name, s.labels.get("worker") or s.labels.get("status", "")): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    wait_for(
        lambda: scraped().get(("symphony_worker_pred_calls_total", stack_worker.name), 0) >= usage.pred_calls,
        timeout=30,
        message="the run's pred calls in the worker's metrics",
    )
    metrics = scraped()
    assert (
        metrics["symphony_worker_up", stack_worker.name] == 1
        and metrics["symphony_worker_forwards_total", stack_worker.name] > 0
    )
    assert metrics["symphony_runs_finished_total", "succeeded"] >= 1


PRINTING_LIP = b"""
import sys

from symphony import detokenize, tokenize


def main(args):
    print("hello from the LIP")
    print("round trip:", detokenize(tokenize("Paris")))
    print("a NUL here: \\x00.")
    print("warning: about to fail" if args.get("fail") else "warning: none", file=sys.stderr)
    if args.get("fail"):
        raise RuntimeError("asked to fail")
    return {"text": "with a NUL \\x00 inside"}
"""


def test_a_programs_prints_are_its_logs_and_nul_loses_nothing(stack, api_tenant_a, tmp_path):
    """stdout/stderr of the LIP in its gVisor sandbox are kept (tail) and served by
    ``GET /runs/<id>/logs`` and ``symphony logs``, for a run that succeeded and one that raised.
    NUL characters a program writes (PostgreSQL cannot store them) reach the tenant as U+FFFD
    instead of losing the run's outcome."""
    from symphony_client import Client

    lip = tmp_path / "printing.py"
    lip.write_bytes(PRINTING_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="printing")
    ok = client.create_run(program["id"], args={}, limits={"deadline_s": 60})
    failing = client.create_run(program["id"], args={"fail": True}, limits={"deadline_s": 60})
    for run in (ok, failing):
        wait_for(lambda r=run: client.get_run(r["id"])["status"] not in ("queued", "running"), timeout=120)

    final = client.get_run(ok["id"])
    assert final["status"] == "succeeded", final
    assert final["result"] == {"text": "with a NUL \ufffd inside"}
    logs = client.run_logs(ok["id"])
    assert logs["stdout"] == "hello from the LIP\nround trip: Paris\na NUL here: \ufffd.\n", logs
    assert logs["stderr"] == "warning: none\n" and logs["truncated"] is False

    failed = client.get_run(failing["id"])
    assert failed["status"] == "failed" and "asked to fail" in failed["error"], failed
    logs = client.run_logs(failing["id"])
    assert logs["stdout"].startswith("hello from the LIP\n")
    assert logs["stderr"].startswith("warning: about to fail\n"), logs

    env = {k: v for k, v in os.environ.items() if not k.startswith("SYMPHONY_")}
    env.update(PYTHONPATH=str(ROOT / "client"), SYMPHONY_CONFIG=str(tmp_path / "cli.json"))
    flags = ["--url", stack, "--api-key", api_tenant_a.key_secret]
    cli = subprocess.run(
        [sys.executable, "-m", "symphony_client", "logs", ok["id"], *flags],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    logs_ok = client.run_logs(ok["id"])
    assert (cli.stdout, cli.stderr) == (logs_ok["stdout"], logs_ok["stderr"])


QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_openai_client_chat_plain_and_streaming_agree(stack, api_tenant_a):
    client = openai_client(stack, api_tenant_a.key_secret, timeout=180)
    assert [m.id for m in client.models.list().data] == ["SmolLM2-135M-Instruct"]
    plain = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=12, temperature=0)
    text = plain.choices[0].message.content
    assert "Paris" in text, text
    assert plain.usage.prompt_tokens > 0 and 0 < plain.usage.completion_tokens <= 12
    stream = client.chat.completions.create(model="any", messages=QUESTION, max_tokens=12, temperature=0, stream=True)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == text
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    assert all(c.usage is None for c in chunks)
    # stream_options.include_usage: one more chunk, no choices, the same usage as the plain answer.
    counted = list(
        client.chat.completions.create(
            model="any",
            messages=QUESTION,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    # The same token counts as the plain answer (how many prompt tokens came from the prefix
    # cache depends on what this tenant sent before).
    assert counted[-1].choices == [] and counted[-1].usage.total_tokens == plain.usage.total_tokens, counted[-1]
    assert counted[-1].usage.prompt_tokens == plain.usage.prompt_tokens
    assert "".join(c.choices[0].delta.content or "" for c in counted[:-1]) == text
    # The same question as OpenAI content parts (text parts joined) gets the same greedy answer.
    parts = [{"type": "text", "text": "What is the capital "}, {"type": "text", "text": "of France?"}]
    as_parts = client.chat.completions.create(
        model="any", messages=[{"role": "user", "content": parts}], max_tokens=12, temperature=0
    )
    assert as_parts.choices[0].message.content == text


def test_openai_client_n_seed_stop_and_json_schema(stack, api_tenant_a):
    import openai

    client = openai_client(stack, api_tenant_a.key_secret, timeout=180)
    sampled = [
        client.chat.completions.create(model="any", messages=QUESTION, max_tokens=8, temperature=0.9, n=3, seed=7)
        for _ in range(2)
    ]
    texts = [[c.message.content for c in r.choices] for r in sampled]
    assert len(texts[0]) == 3 and all(texts[0]), texts
    assert texts[0] == texts[1], "the same seed must give the same choices"

    counted = client.completions.create(model="any", prompt="1, 2, 3, 4,", max_tokens=10, temperature=0, stop=[","])
    assert counted.choices[0].finish_reason == "stop" and "," not in counted.choices[0].text, counted

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"type": "string", "maxLength": 20}},
        "required": ["city", "country"],
        "additionalProperties": False,
    }
    structured = client.chat.completions.create(
        model="any",
        messages=[{"role": "user", "content": "Name a city and its country as JSON."}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}},
    )
    import json

    value = json.loads(structured.choices[0].message.content)
    assert set(value) == {"city", "country"} and all(isinstance(v, str) for v in value.values()), value

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="any", messages=QUESTION, n=100)
    with pytest.raises(openai.AuthenticationError):
        openai_client(stack, "sk_wrong_key", timeout=180).chat.completions.create(model="any", messages=QUESTION)


ENDLESS_LIP = b"""
from symphony import kv_create, kv_truncate, pred, send_to_user


def main(args):
    kv = kv_create()
    dist = pred(kv, [1, 2, 3])[-1]
    step = 0
    while True:  # decodes until something stops it: its deadline, its tokens, or a cancel
        dist = pred(kv, [dist.argmax()])[-1]
        step += 1
        send_to_user(f"step {step} ")
        if step % 32 == 0:
            kv_truncate(kv, 3)
"""


def _usage_of(run_id: str, timeout: float):
    from api.models import UsageRecord

    wait_for(lambda: UsageRecord.objects.filter(run_id=run_id).exists(), timeout=timeout, message="the run's usage")
    return UsageRecord.objects.get(run_id=run_id)


def test_cancelling_a_running_run_stops_its_program(stack, api_tenant_a, tmp_path):
    """Cancel reaches the program in its sandbox: the executor sees the flag, ends the worker
    session, the LIP's next call fails and the run's usage is recorded seconds later, not at its
    120 s deadline; the run stays cancelled and says so."""
    from symphony_client import Client

    lip = tmp_path / "endless.py"
    lip.write_bytes(ENDLESS_LIP)
    client = Client(stack, api_tenant_a.key_secret, timeout=60)
    program = client.upload_program(lip, name="endless")
    run = client.create_run(program["id"], limits={"deadline_s": 120})
    for event in client.events(run["id"]):
        if event.type == "token":
            break  # the program is decoding
    cancelled_at = time.monotonic()
    assert client.cancel_run(run["id"])["status"] == "cancelled"
    usage = _usage_of(run["id"], timeout=60)
    assert time.monotonic() - cancelled_at < 30
    assert 0 < usage.sandbox_seconds < 60 and usage.decode_tokens > 0
    final = client.get_run(run["id"])
    assert final["status"] == "cancelled" and final["error"].startswith("cancelled while running"), final


def test_an_openai_client_that_disconnects_cancels_its_run(stack, api_tenant_a):
    """A streaming completion whose client goes away mid-answer stops its run (as vLLM's
    server aborts the request), instead of decoding the rest of max_tokens for nobody."""
    body = {"model": "any", "prompt": "Count: 1, 2, 3,", "max_tokens": 4000, "temperature": 0, "stream": True}
    headers = {"Authorization": f"Bearer {api_tenant_a.key_secret}"}
    with httpx.Client(base_url=stack, timeout=60) as http:
        with http.stream("POST", "/v1/completions", json=body, headers=headers) as response:
            assert response.status_code == 200
            run_id = response.headers["X-Symphony-Run-Id"]
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # one token arrived; now hang up
    from api.models import Run

    wait_for(lambda: Run.objects.get(pk=run_id).status == "cancelled", timeout=30, message="the run cancelled")
    assert _usage_of(run_id, timeout=60).decode_tokens < 4000

    # Not streaming: the client gives up waiting (its read timeout) and closes the connection.
    before = set(Run.objects.values_list("pk", flat=True))
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=stack, timeout=httpx.Timeout(60, read=5)) as http:
        http.post("/v1/completions", json={**body, "stream": False}, headers=headers)
    (run_id,) = set(Run.objects.values_list("pk", flat=True)) - before
    wait_for(lambda: Run.objects.get(pk=run_id).status == "cancelled", timeout=30, message="the run cancelled")
    assert _usage_of(run_id, timeout=60).decode_tokens < 4000
