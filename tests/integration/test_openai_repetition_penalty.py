"""vLLM's ``repetition_penalty`` (its clients and ``vllm bench serve`` send it) is honoured on
``/v1/chat/completions`` and ``/v1/completions`` by the built-in program's sampler, through the
whole real stack and the ``openai`` client: a greedy answer that repeats itself changes under
the penalty, 1 changes nothing, and a value vLLM refuses is refused here too."""

from __future__ import annotations

import pytest

from tests.integration.openai_support import openai_client
from tests.plugins.worker import RunningWorker

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.integration,
    pytest.mark.docker,
    pytest.mark.vllm,
    pytest.mark.timeout(600),
]

REPEAT = [{"role": "user", "content": "Write the word apple twenty times, separated by spaces."}]


@pytest.fixture(scope="module")
def stack_worker(shared_real_model_worker: RunningWorker) -> RunningWorker:
    """The worker on the real default model in float32 (so transformers can be matched exactly)."""
    return shared_real_model_worker


def test_repetition_penalty_changes_what_the_sampler_chooses(stack, api_tenant_a):
    import openai

    client = openai_client(stack, api_tenant_a.key_secret)

    def chat(**extra: float) -> str:
        answer = client.chat.completions.create(
            model="any", messages=REPEAT, max_tokens=32, temperature=0, extra_body=extra
        )
        return answer.choices[0].message.content or ""

    plain = chat()
    assert chat(repetition_penalty=1.0) == plain  # 1 leaves every choice alone
    penalised = chat(repetition_penalty=3.0)
    assert penalised != plain, plain  # its first words repeat the prompt's: now less likely

    def complete(**extra: float) -> str:
        answer = client.completions.create(
            model="any", prompt="apple apple apple apple apple", max_tokens=16, temperature=0, extra_body=extra
        )
        return answer.choices[0].text

    plain_text, penalised_text = complete(), complete(repetition_penalty=3.0)
    assert penalised_text != plain_text, plain_text
    assert penalised_text.count("apple") < max(1, plain_text.count("apple")), (plain_text, penalised_text)

    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="any", messages=REPEAT, max_tokens=4, extra_body={"repetition_penalty": 0})
    assert "repetition_penalty must be greater than 0" in str(refused.value)
