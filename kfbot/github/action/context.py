"""The runner's environment as the Action's modes read it: the event, the inputs, the
checkout, the token, the GitHub client and the pull request's status comment."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from github.Repository import Repository

from kfbot.config import Config, GithubConfig, load_config
from kfbot.errors import KfbotError
from kfbot.github.action_io import ActionInputs
from kfbot.github.api import DEFAULT_RETRY, call, connect, repository
from kfbot.github.handoff import Recorder
from kfbot.github.prbody import run_url
from kfbot.github.redaction import Redactor
from kfbot.github.status import StatusComment, StatusSink

# Seconds between GitHub API reads and between writes, "READ,WRITE": GitHub answers
# bursts of writes from integrations with secondary rate limits. Tests against a local
# server set "0,0".
INTERVALS_VARIABLE = "KFBOT_GITHUB_INTERVALS"


DEFAULT_INTERVALS = (0.25, 1.0)


@dataclass(frozen=True)
class Context:
    env: Mapping[str, str]
    inputs: ActionInputs
    redact: Redactor
    event_name: str
    event_path: Path
    repository: str
    root: Path
    recorder: Recorder | None = None  # set: write nothing to GitHub, hand it over instead

    @classmethod
    def from_env(cls, env: Mapping[str, str], inputs: ActionInputs, redact: Redactor,
                 root: Path | None = None) -> Context:
        def need(name: str) -> str:
            value = env.get(name, "").strip()
            if not value:
                raise KfbotError(f"{name} is not set: `kfbot action` runs inside a GitHub "
                                 "Actions job (or set the GITHUB_* variables as a job would)")
            return value

        root = (root or Path(env.get("GITHUB_WORKSPACE") or ".")).resolve()
        return cls(env, inputs, redact, need("GITHUB_EVENT_NAME"),
                   Path(need("GITHUB_EVENT_PATH")), need("GITHUB_REPOSITORY"), root)

    def config(self) -> Config:
        path = self.root / self.inputs.config if self.inputs.config else None
        return load_config(path, self.root)

    def github_config(self, base: GithubConfig) -> GithubConfig:
        if self.inputs.min_speedup is None:
            return base
        return dataclasses.replace(base, min_speedup=self.inputs.min_speedup)

    def token(self) -> str:
        token = self.inputs.token  # the input, else $GITHUB_TOKEN (see Action._result)
        if not token:
            raise KfbotError("no GitHub token: set the action's 'token' input (its default is "
                             "the job's GITHUB_TOKEN) or the GITHUB_TOKEN variable")
        return token

    def intervals(self) -> tuple[float, float]:
        text = self.env.get(INTERVALS_VARIABLE, "").strip()
        if not text:
            return DEFAULT_INTERVALS
        try:
            read, write = (float(part) for part in text.split(","))
        except ValueError:
            raise KfbotError(f"{INTERVALS_VARIABLE}: expected READ,WRITE seconds such as "
                             f"0.25,1, got {text!r}") from None
        return read, write

    def github(self) -> Repository:
        read, write = self.intervals()
        gh = connect(self.token(), env=self.env, read_interval=read, write_interval=write)
        return repository(gh, self.repository, DEFAULT_RETRY)

    def run_url(self) -> str | None:
        return run_url(self.env)

    def status(self, repo: Repository, number: int, key: str) -> StatusComment:
        issue = call(lambda: repo.get_issue(number), f"reading pull request #{number}",
                     DEFAULT_RETRY)
        return StatusComment(issue, key, self.redact, DEFAULT_RETRY)

    def status_sink(self, number: int, key: str) -> StatusSink:
        """The pull request's status comment, or, in a job that hands its run over, the
        handoff (the publish job posts it)."""
        if self.recorder is not None:
            return self.recorder
        return self.status(self.github(), number, key)
