"""Mail fixtures: a real SMTP server on 127.0.0.1 (aiosmtpd) that keeps what it receives, and the
web server plus a Celery worker sending through it, as in production (api/services/mail.py).

``mail_stack`` is the whole path a mail takes: an HTTP request to uvicorn queues a Celery task on
a private queue, a real ``celery worker`` renders the mail and speaks SMTP to the sink, and the
test reads the message the sink received. Browser scenarios use its ``url`` as their base URL.
"""

from __future__ import annotations

import email
import re
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.message import EmailMessage
from email.policy import default as default_policy
from pathlib import Path

import pytest
import requests
from aiosmtpd.controller import Controller

from tests.conftest import celery_worker
from tests.plugins.browser import child_env_for_test_db, free_port, start_uvicorn, stop


@dataclass
class SmtpSink:
    """What the SMTP server on ``host:port`` received, in order."""

    host: str
    port: int
    messages: list[EmailMessage] = field(default_factory=list)
    #: address -> the SMTP reply that refuses it (e.g. "550 5.1.1 no such mailbox").
    refuse: dict[str, str] = field(default_factory=dict)
    _arrived: threading.Condition = field(default_factory=threading.Condition)

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options) -> str:  # aiosmtpd's hook
        if address.lower() in self.refuse:
            return self.refuse[address.lower()]
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's handler hook
        message = email.message_from_bytes(envelope.content, policy=default_policy)
        with self._arrived:
            self.messages.append(message)
            self._arrived.notify_all()
        return "250 Message accepted for delivery"

    def wait_for(self, to: str, subject_contains: str, timeout: float = 60) -> EmailMessage:
        """The first message to ``to`` whose subject contains ``subject_contains``; fails the
        test after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                for message in self.messages:
                    if to.lower() in message["To"].lower() and subject_contains in message["Subject"]:
                        return message
                left = deadline - time.monotonic()
                if left <= 0:
                    got = [(m["To"], m["Subject"]) for m in self.messages]
                    pytest.fail(f"no mail to {to} about {subject_contains!r} within {timeout}s; got {got}")
                self._arrived.wait(left)

    def to(self, address: str) -> list[EmailMessage]:
        with self._arrived:
            return [m for m in self.messages if address.lower() in m["To"].lower()]


def link_in(message: EmailMessage, base_url: str, path: str) -> str:
    """The link to ``base_url`` + ``path``... in a plain-text mail's body."""
    body = message.get_body(preferencelist=("plain",)).get_content()
    found = re.search(re.escape(base_url + path) + r"\S*", body)
    assert found, f"no {path} link in the mail:\n{body}"
    return found.group(0)


def login_status(url: str, email: str, password: str) -> int:
    """The status of signing in over HTTP the way the console does it (CSRF cookie, then the
    header): 200 for the right password, 401 for a wrong one."""
    session = requests.Session()
    token = session.get(f"{url}/api/v1/auth/csrf", timeout=10).json()["csrftoken"]
    body = {"email": email, "password": password}
    return session.post(f"{url}/api/v1/auth/login", json=body, headers={"X-CSRFToken": token}, timeout=10).status_code


def signed_up(url: str, email: str, password: str, tenant: str) -> requests.Session:
    """A new account and tenant, signed up over HTTP the way the console does it (CSRF cookie,
    then the header); the session stays signed in, with the rotated CSRF token as its header."""
    session = requests.Session()
    token = session.get(f"{url}/api/v1/auth/csrf", timeout=10).json()["csrftoken"]
    session.headers.update({"X-CSRFToken": token, "Referer": url})
    body = {"email": email, "password": password, "tenant_name": tenant}
    response = session.post(f"{url}/api/v1/auth/signup", json=body, timeout=10)
    assert response.status_code == 201, response.text
    session.headers["X-CSRFToken"] = session.cookies["csrftoken"]  # rotated at sign-in
    return session


def verification_link_file(stack: MailStack, email: str, path: Path) -> Path:
    """Write the verification link mailed to ``email`` at sign-up to ``path`` once it arrives
    (a browser scenario waits for the file and opens the link, as the person would); returns
    ``path``. A thread, since the scenario signs up after this is called."""

    def deliver() -> None:
        message = stack.smtp.wait_for(email, "Verify your Symphony email", timeout=120)
        path.write_text(link_in(message, stack.url, "/verify-email/"))

    threading.Thread(target=deliver, daemon=True).start()
    return path


@pytest.fixture
def smtp_sink() -> Iterator[SmtpSink]:
    sink = SmtpSink("127.0.0.1", free_port())
    controller = Controller(sink, hostname=sink.host, port=sink.port)
    controller.start()
    try:
        yield sink
    finally:
        controller.stop()


@dataclass
class MailStack:
    url: str  # the console and API, also SYMPHONY_PUBLIC_URL: the links in mails point here
    smtp: SmtpSink


@pytest.fixture
def mail_stack(transactional_db, console_dist, smtp_sink) -> Iterator[MailStack]:
    """uvicorn and a Celery worker on a private queue, both mailing through ``smtp_sink``."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **child_env_for_test_db(),
        "SYMPHONY_EMAIL_URL": f"smtp://{smtp_sink.host}:{smtp_sink.port}",
        "SYMPHONY_PUBLIC_URL": url,
        # Mail tasks go to the default queue: a private one, so no other Celery worker takes them.
        "CELERY_DEFAULT_QUEUE": f"mail-{uuid.uuid4().hex[:8]}",
    }
    with celery_worker(env["CELERY_DEFAULT_QUEUE"], env):
        proc, _ = start_uvicorn(env, port)
        try:
            yield MailStack(url=url, smtp=smtp_sink)
        finally:
            stop(proc)
