"""GitHub-shaped JSON, with URLs on the fake server (fake_github.py), for the records it
stores."""

from __future__ import annotations

import urllib.parse
import zlib
from typing import TYPE_CHECKING

from fake_github_records import JSON, NOW, REACTIONS, Repo

if TYPE_CHECKING:
    from fake_github import FakeGitHub

class Render:
    """Turns stored records into GitHub-shaped JSON with URLs on this server."""

    def __init__(self, server: FakeGitHub) -> None:
        self.s = server
        self.api = server.base_url

    def user(self, login: str, kind: str | None = None) -> JSON:
        kind = kind or ("Bot" if login.endswith("[bot]") else "User")
        return {"login": login, "id": zlib.crc32(login.encode()),
                "node_id": f"U_{login}", "type": kind, "site_admin": False,
                "url": f"{self.api}/users/{login}", "html_url": f"https://github.com/{login}",
                "avatar_url": f"https://avatars.example/{login}"}

    def repo(self, repo: Repo) -> JSON:
        owner, name = repo.full_name.split("/", 1)
        url = f"{self.api}/repos/{repo.full_name}"
        data = {"id": repo.id, "node_id": f"R_{repo.id}", "name": name,
                "full_name": repo.full_name, "private": repo.private, "fork": repo.fork,
                "owner": self.user(owner, "Organization"), "url": url,
                "html_url": f"https://github.com/{repo.full_name}",
                "clone_url": str(repo.bare) if repo.bare else
                f"https://github.com/{repo.full_name}.git",
                "default_branch": repo.default_branch, "description": None,
                "visibility": "private" if repo.private else "public",
                "archived": False, "disabled": False,
                "pulls_url": f"{url}/pulls{{/number}}", "issues_url": f"{url}/issues{{/number}}",
                "created_at": NOW, "updated_at": NOW, "pushed_at": NOW,
                "permissions": {"admin": False, "push": True, "pull": True}}
        if repo.parent is not None and repo.parent in self.s.repos:
            data["parent"] = data["source"] = self.repo(self.s.repos[repo.parent])
        return data

    def label(self, full_name: str, name: str) -> JSON:
        stored = self.s.labels[full_name].setdefault(
            name, {"id": self.s.new_id(), "name": name, "color": "ededed",
                   "description": None, "default": False})
        return {**stored, "node_id": f"LA_{stored['id']}",
                "url": f"{self.api}/repos/{full_name}/labels/{urllib.parse.quote(name)}"}

    def ref_side(self, repo: Repo, ref: str, sha: str) -> JSON:
        owner = repo.full_name.split("/", 1)[0]
        return {"label": f"{owner}:{ref}", "ref": ref, "sha": sha,
                "user": self.user(owner, "Organization"), "repo": self.repo(repo)}

    def pull(self, full_name: str, pr: JSON) -> JSON:
        self.s.refresh(full_name, pr)
        repo = self.s.repos[full_name]
        n = pr["number"]
        url = f"{self.api}/repos/{full_name}/pulls/{n}"
        issue_url = f"{self.api}/repos/{full_name}/issues/{n}"
        base_sha = self.s.branch_sha(repo, pr["base_ref"]) or "0" * 40
        html = f"https://github.com/{full_name}/pull/{n}"
        return {"id": pr["id"], "node_id": f"PR_{pr['id']}", "number": n, "url": url,
                "html_url": html, "diff_url": f"{html}.diff", "patch_url": f"{html}.patch",
                "issue_url": issue_url, "commits_url": f"{url}/commits",
                "comments_url": f"{issue_url}/comments",
                "review_comments_url": f"{url}/comments",
                "statuses_url": f"{self.api}/repos/{full_name}/statuses/{pr['head_sha']}",
                "state": pr["state"], "locked": False, "title": pr["title"], "body": pr["body"],
                "user": self.user(pr["user"]),
                "labels": [self.label(full_name, name) for name in pr["labels"]],
                "milestone": None, "active_lock_reason": None, "created_at": pr["created_at"],
                "updated_at": pr["updated_at"], "closed_at": pr["closed_at"],
                "merged_at": None, "merge_commit_sha": None, "assignee": None,
                "assignees": [], "requested_reviewers": [], "requested_teams": [],
                "head": self.ref_side(self.s.repos[pr["head_repo"]], pr["head_ref"],
                                      pr["head_sha"]),
                "base": self.ref_side(repo, pr["base_ref"], base_sha),
                "author_association": "NONE", "auto_merge": None, "draft": pr["draft"],
                "merged": False, "mergeable": True, "rebaseable": True,
                "mergeable_state": "clean", "merged_by": None, "comments": 0,
                "review_comments": 0, "maintainer_can_modify": False,
                "commits": len(self.s.pr_commits(full_name, pr)), "additions": 0,
                "deletions": 0, "changed_files": 0}

    def issue(self, full_name: str, number: int) -> JSON:
        pr = self.s.pulls[full_name].get(number)
        record = pr if pr is not None else self.s.issues[full_name][number]
        if pr is not None:
            self.s.refresh(full_name, pr)
        url = f"{self.api}/repos/{full_name}/issues/{number}"
        kind = "pull" if pr is not None else "issues"
        data = {"id": record["id"], "node_id": f"I_{record['id']}", "number": number,
                "url": url, "repository_url": f"{self.api}/repos/{full_name}",
                "labels_url": f"{url}/labels{{/name}}", "comments_url": f"{url}/comments",
                "events_url": f"{url}/events",
                "html_url": f"https://github.com/{full_name}/{kind}/{number}",
                "title": record["title"], "body": record["body"],
                "user": self.user(record["user"]), "state": record["state"], "locked": False,
                "labels": [self.label(full_name, name) for name in record["labels"]],
                "assignee": None, "assignees": [], "milestone": None,
                "comments": len(self.s.comments_on(full_name, number)),
                "created_at": record["created_at"], "updated_at": record["updated_at"],
                "closed_at": record["closed_at"], "author_association": "NONE"}
        if pr is not None:
            pull_url = f"{self.api}/repos/{full_name}/pulls/{number}"
            data["pull_request"] = {"url": pull_url, "html_url": data["html_url"],
                                    "diff_url": f"{data['html_url']}.diff",
                                    "patch_url": f"{data['html_url']}.patch"}
            data["draft"] = pr["draft"]
        return data

    def comment(self, comment: JSON) -> JSON:
        full_name, cid = comment["repo"], comment["id"]
        url = f"{self.api}/repos/{full_name}/issues/comments/{cid}"
        kind = "pull" if comment["issue"] in self.s.pulls[full_name] else "issues"
        counts = {content: 0 for content in REACTIONS}
        for reaction in self.s.reactions.get(cid, []):
            counts[reaction["content"]] += 1
        return {"id": cid, "node_id": f"IC_{cid}", "url": url,
                "html_url": f"https://github.com/{full_name}/{kind}/{comment['issue']}"
                            f"#issuecomment-{cid}",
                "issue_url": f"{self.api}/repos/{full_name}/issues/{comment['issue']}",
                "body": comment["body"], "user": self.user(comment["user"], comment["user_type"]),
                "created_at": comment["created_at"], "updated_at": comment["updated_at"],
                "author_association": comment["association"],
                "reactions": {"url": f"{url}/reactions", "total_count": sum(counts.values()),
                              **counts}}

    def reaction(self, reaction: JSON) -> JSON:
        return {"id": reaction["id"], "node_id": f"REA_{reaction['id']}",
                "user": self.user(reaction["user"]), "content": reaction["content"],
                "created_at": NOW}

    def commit(self, full_name: str, c: JSON) -> JSON:
        url = f"{self.api}/repos/{full_name}/commits/{c['sha']}"

        def person(kind: str) -> JSON:
            return {"name": c[f"{kind}_name"], "email": c[f"{kind}_email"],
                    "date": c[f"{kind}_date"]}

        return {"sha": c["sha"], "node_id": f"C_{c['sha']}", "url": url,
                "html_url": f"https://github.com/{full_name}/commit/{c['sha']}",
                "commit": {"author": person("author"), "committer": person("committer"),
                           "message": c["message"], "url": url,
                           "tree": {"sha": "0" * 40, "url": url}, "comment_count": 0},
                "author": None, "committer": None,
                "parents": [{"sha": p, "url": f"{self.api}/repos/{full_name}/commits/{p}"}
                            for p in c["parents"]]}

    def branch(self, full_name: str, name: str, sha: str) -> JSON:
        url = f"{self.api}/repos/{full_name}"
        return {"name": name, "protected": False,
                "commit": {"sha": sha, "url": f"{url}/commits/{sha}",
                           "node_id": f"C_{sha}"},
                "_links": {"self": f"{url}/branches/{name}",
                           "html": f"https://github.com/{full_name}/tree/{name}"}}

    def ref(self, full_name: str, name: str, sha: str) -> JSON:
        url = f"{self.api}/repos/{full_name}/git/refs/heads/{name}"
        return {"ref": f"refs/heads/{name}", "node_id": f"REF_{name}", "url": url,
                "object": {"sha": sha, "type": "commit",
                           "url": f"{self.api}/repos/{full_name}/git/commits/{sha}"}}
