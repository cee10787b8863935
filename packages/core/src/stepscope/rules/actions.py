"""What happens when a rule fires: stop the training job, log, or POST the report to a
webhook. Also reads smdebug-rulesconfig's ActionList (its serialized JSON or the object)."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..capture.control import request_stop
from ..exceptions import ConfigError

if TYPE_CHECKING:
    from ..store import Store
    from .report import RuleReport


class FiredRule(Protocol):
    """What an action sees of the rule that fired (rules.base.Rule is one): its name, its
    report so far, and the job's store and path."""

    name: str
    report: RuleReport

    @property
    def store(self) -> Store: ...

    @property
    def path(self) -> str: ...

logger = logging.getLogger("stepscope")

UNSUPPORTED = ("email", "sms")


class Action:
    """Run once, the first time its rule fires."""

    def trigger(self, rule: FiredRule, step: int | None) -> None:
        """`step`: the global step the rule fired at; None for a whole-job rule."""
        raise NotImplementedError


@dataclass
class StopTraining(Action):
    """Writes a stop request into the job's store; the hooks poll for it and end training
    at the end of a step (plain loops: StopTrainingRequested, Lightning: trainer.should_stop,
    Keras: model.stop_training). `training_job_prefix` comes from SageMaker configurations
    and is ignored: the job stopped is the one the rule reads."""

    training_job_prefix: str | None = None

    def trigger(self, rule: FiredRule, step: int | None) -> None:
        reason = _last_message(rule) or f"fired at step {step}"
        request_stop(rule.store, rule.name, reason, step=step)
        logger.warning("stepscope: rule %s asked %s to stop training (step %s)", rule.name, rule.path, step)


@dataclass
class Log(Action):
    """Logs the firing on the `stepscope` logger at `level` (default WARNING)."""

    level: int = logging.WARNING

    def trigger(self, rule: FiredRule, step: int | None) -> None:
        where = rule.report.evidence[-1].where if rule.report.evidence else f"step {step}"
        logger.log(self.level, "stepscope: rule %s fired at %s on %s: %s", rule.name, where, rule.path, _last_message(rule))


MAX_WEBHOOK_TIMEOUT_S = 300.0
MAX_WEBHOOK_RETRIES = 10


@dataclass
class Webhook(Action):
    """POSTs {"rule", "step", "trial", "report"} as JSON to `url`. `timeout` bounds the
    whole call, retries and backoff included (a server trickling its answer cannot hold a
    check longer). Failures (connection errors, 5xx, 429) are retried `retries` times with
    exponential backoff from `backoff` seconds; other 4xx are not. Redirects are not
    followed (a 3xx is a failure: following one would resend the report elsewhere, or lose
    its body); a failure raises, and the rule engine records it in the rule's report."""

    url: str
    timeout: float = 5.0
    retries: int = 3
    backoff: float = 0.5
    headers: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"Webhook.url must be an http:// or https:// URL, got {self.url!r}")
        parts = urllib.parse.urlsplit(self.url)
        if not parts.hostname:
            raise ConfigError(f"Webhook.url has no host: {self.url!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not 0 < self.timeout <= MAX_WEBHOOK_TIMEOUT_S:
            raise ConfigError(f"Webhook.timeout must be in (0, {MAX_WEBHOOK_TIMEOUT_S:g}] seconds, got {self.timeout!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or not 0 <= self.retries <= MAX_WEBHOOK_RETRIES:
            raise ConfigError(f"Webhook.retries must be an integer in [0, {MAX_WEBHOOK_RETRIES}], got {self.retries!r}")
        if isinstance(self.backoff, bool) or not isinstance(self.backoff, (int, float)) or not 0 <= self.backoff <= self.timeout:
            raise ConfigError(f"Webhook.backoff must be in [0, timeout] seconds, got {self.backoff!r}")

    def payload(self, rule: FiredRule, step: int | None) -> bytes:
        body = {"rule": rule.name, "step": step, "trial": rule.path, "report": rule.report.to_json()}
        return json.dumps(body, default=str).encode()

    def trigger(self, rule: FiredRule, step: int | None) -> None:
        self.post(self.payload(rule, step))

    def post(self, data: bytes) -> None:
        """One delivery, within `timeout` seconds in all; raises RuntimeError on failure."""
        headers = {"Content-Type": "application/json", "User-Agent": "stepscope", **(self.headers or {})}
        deadline = time.monotonic() + self.timeout
        last_error = "no attempt was made"
        for attempt in range(self.retries + 1):
            if attempt:
                pause = self.backoff * 2 ** (attempt - 1)
                if time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            status, reason = _post_once(self.url, data, headers, remaining)
            if status is not None and 200 <= status < 300:
                return
            last_error = reason
            if status is not None and (300 <= status < 500 and status != 429):
                break  # a redirect or a client error: trying again changes nothing
        else:
            raise RuntimeError(f"webhook {self.url} failed: {last_error}")
        raise RuntimeError(f"webhook {self.url} failed within its {self.timeout:g} s: {last_error}")


def _post_once(url: str, data: bytes, headers: Mapping[str, str], limit: float) -> tuple[int | None, str]:
    """(status, reason) of one POST, given at most `limit` seconds in all: the request runs
    on a helper thread and its socket is shut when time is up (a per-read timeout alone
    lets a server that trickles bytes hold the call forever)."""
    parts = urllib.parse.urlsplit(url)
    connection_class = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = connection_class(parts.hostname or "", parts.port, timeout=limit)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    outcome: list[tuple[int | None, str]] = []

    def run() -> None:
        try:
            connection.request("POST", path, body=data, headers=dict(headers))
            response = connection.getresponse()
            response.read(64 * 1024)
            if 300 <= response.status < 400:
                where = response.getheader("Location", "?")
                outcome.append((response.status, f"HTTP {response.status}: redirected to {where!r}; webhooks do not follow redirects"))
            else:
                outcome.append((response.status, f"HTTP {response.status} {response.reason}"))
        except Exception as exc:  # any failure of one attempt is reported, not raised
            outcome.append((None, f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=run, name="stepscope-webhook", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        sock = connection.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        connection.close()
        return None, f"no complete answer within {limit:.3g} s"
    connection.close()
    return outcome[0] if outcome else (None, "no answer")


def _last_message(rule: FiredRule) -> str:
    return rule.report.evidence[-1].message if rule.report.evidence else ""


def _unsupported(name: str) -> ConfigError:
    return ConfigError(f"action {name!r} is not supported by stepscope (it used AWS SNS); use a webhook instead, e.g. {{\"name\": \"webhook\", \"url\": \"https://...\"}}")


def action_from_json(entry: Mapping[str, Any]) -> Action:
    """One action from its smdebug-rulesconfig JSON ({"name": "stoptraining", ...}) or
    stepscope's ({"name": "webhook", "url": ...}, {"name": "log"})."""
    if not isinstance(entry, Mapping) or "name" not in entry:
        raise ConfigError(f"an action must be an object with a 'name', got {entry!r}")
    name = str(entry["name"]).strip().lower()
    params = {k: v for k, v in entry.items() if k != "name"}
    if name in UNSUPPORTED:
        raise _unsupported(name)
    if name == "stoptraining":
        return StopTraining(params.get("training_job_prefix"))
    if name == "log":
        level = params.get("level", "WARNING")
        return Log(level if isinstance(level, int) else logging.getLevelName(str(level).upper()))
    if name == "webhook":
        url = str(params.get("url") or params.get("endpoint") or "")
        try:
            return Webhook(
                url, timeout=float(params.get("timeout", 5.0)), retries=int(params.get("retries", 3)), backoff=float(params.get("backoff", 0.5))
            )
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"webhook action: {exc}") from None
    raise ConfigError(f"unknown action {entry['name']!r}; valid: stoptraining, log, webhook (email and sms are not supported: use a webhook)")


def parse_actions(spec: Any) -> list[Action]:
    """Actions from an smdebug-rulesconfig ActionList (the object, or its `serialize()`
    string, whose quotes are backslash-escaped), a JSON string, or a list of dicts/Actions."""
    if spec is None or spec == "":
        return []
    if isinstance(spec, Action):
        return [spec]
    if hasattr(spec, "actions") and not isinstance(spec, (str, bytes, Mapping)):  # smdebug_rulesconfig.ActionList
        return [a for item in spec.actions for a in parse_actions(item)]
    if hasattr(spec, "action_parameters"):  # one smdebug_rulesconfig Action
        return [action_from_json(spec.action_parameters)]
    if isinstance(spec, (str, bytes)):
        text = spec.decode() if isinstance(spec, bytes) else spec
        try:
            data = json.loads(text)
        except ValueError:
            try:
                data = json.loads(text.replace('\\"', '"'))
            except ValueError:
                raise ConfigError(f"actions: not valid JSON: {text[:200]!r}") from None
        return parse_actions(data)
    if isinstance(spec, Mapping):
        return [action_from_json(spec)]
    if isinstance(spec, Iterable):
        return [a for item in spec for a in parse_actions(item)]
    raise ConfigError(f"actions: cannot read {spec!r}")


__all__ = ["Action", "FiredRule", "StopTraining", "Log", "Webhook", "parse_actions", "action_from_json"]
