"""A small client for the healthchecks.io Management API v3 (list, upsert, delete checks).

Every request has an explicit timeout. Every failure becomes one `ApiError` whose message is a
single line naming what went wrong (HTTP status, the API's own error text, the field it
rejected); the API key travels only in the `X-Api-Key` header and is scrubbed from any
message, so it cannot reach the output.
"""

import requests

TIMEOUT = (5.0, 20.0)  # connect, read


class ApiError(Exception):
    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class HealthchecksAPI:
    def __init__(self, base_url: str, api_key: str, *, timeout=TIMEOUT, session=None):
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.api_key = api_key
        self.timeout = timeout
        self.session = session or requests.Session()

    def _scrub(self, text: str) -> str:
        text = " ".join(str(text).split())
        if self.api_key:
            text = text.replace(self.api_key, "<api key>")
        return text[:300]

    def _request(self, method: str, path: str, what: str, **kwargs):
        url = self.base_url + path
        try:
            response = self.session.request(
                method,
                url,
                headers={"X-Api-Key": self.api_key, "Accept": "application/json"},
                timeout=self.timeout,
                **kwargs,
            )
        except requests.Timeout:
            raise ApiError(
                f"{what}: the healthchecks.io API at {self.base_url} did not answer in time"
            ) from None
        except requests.RequestException as exc:
            reason = type(exc).__name__
            if isinstance(exc, requests.ConnectionError):
                reason = "connection failed"
            raise ApiError(
                f"{what}: cannot reach the healthchecks.io API at {self.base_url} ({reason})"
            ) from None
        if response.status_code in (200, 201):
            try:
                return response.status_code, response.json()
            except ValueError:
                raise ApiError(
                    f"{what}: the API at {self.base_url} answered {response.status_code} "
                    "without JSON (is HEALTHCHECKS_API_URL the /api/v3/ URL?)",
                    response.status_code,
                ) from None
        raise ApiError(f"{what}: {self._explain(response)}", response.status_code)

    def _explain(self, response) -> str:
        status = response.status_code
        try:
            detail = response.json().get("error", "")
        except (ValueError, AttributeError):
            detail = response.text
        detail = self._scrub(detail)
        if status == 401:
            return (
                f"401 {detail or 'unauthorized'}: HEALTHCHECKS_API_KEY is not a read-write API "
                "key of this project (Project Settings → API Access)"
            )
        if status == 403:
            return (
                f"403 {detail or 'forbidden'}: the check belongs to another project, or the "
                "account's check limit is reached"
            )
        if status == 429:
            return "429 rate limited by healthchecks.io: run it again in a minute"
        if status == 400:
            return f"400 rejected: {detail or 'bad request'}"
        if status == 404:
            return f"404 not found at {self.base_url} (is HEALTHCHECKS_API_URL right?)"
        return f"{status} {detail or response.reason or 'error'}"

    # --- the calls sync_healthchecks makes ------------------------------------------------------

    def list_checks(self, tag: str | None = None) -> list[dict]:
        params = {"tag": tag} if tag else None
        what = f"listing checks tagged {tag!r}" if tag else "listing checks"
        _, body = self._request("GET", "checks/", what, params=params)
        return list(body.get("checks", []))

    def can_write(self) -> bool:
        """Whether the key may change checks, asked without changing any: the integrations'
        list takes the read-write key only (the read-only one gets 401)."""
        try:
            self._request("GET", "channels/", "listing integrations")
        except ApiError as exc:
            return exc.status != 401  # anything else: the writes will say what it is
        return True

    def upsert(self, spec: dict) -> tuple[bool, dict]:
        """Create or update the check with `spec["slug"]`: (created, the check as stored)."""
        payload = {k: v for k, v in spec.items() if v is not None}  # the API rejects nulls
        payload["unique"] = ["slug"]
        status, body = self._request(
            "POST", "checks/", f"upserting check {spec.get('slug')!r}", json=payload
        )
        return status == 201, body

    def delete(self, uuid: str, slug: str) -> None:
        self._request("DELETE", f"checks/{uuid}", f"deleting check {slug!r}")

    # --- the calls job_pause and job_resume make (ops/monitors/hcpause.py) ------------------------

    def get_check(self, uuid: str) -> dict:
        return self._request("GET", f"checks/{uuid}", f"reading check {uuid}")[1]

    def checks_with_slug(self, slug: str) -> list[dict]:
        _, body = self._request("GET", "checks/", f"listing checks {slug!r}", params={"slug": slug})
        return [c for c in body.get("checks", []) if c.get("slug") == slug]

    def update(self, uuid: str, fields: dict, slug: str) -> dict:
        return self._request("POST", f"checks/{uuid}", f"updating check {slug!r}", json=fields)[1]

    def pause(self, uuid: str, slug: str) -> dict:
        return self._request("POST", f"checks/{uuid}/pause", f"pausing check {slug!r}")[1]

    def resume(self, uuid: str, slug: str) -> dict | None:
        """The check, resumed (`new`); None when it was not paused (the server's 409)."""
        try:
            return self._request("POST", f"checks/{uuid}/resume", f"resuming check {slug!r}")[1]
        except ApiError as exc:
            if exc.status == 409:
                return None
            raise


READ_ONLY = (
    "HEALTHCHECKS_API_KEY is the project's read-only API key: sync_healthchecks needs its "
    "read-write key (Project Settings → API Access); nothing was changed"
)


def read_only_listing(checks: list[dict]) -> bool:
    """A listing made with the read-only key: `unique_key` instead of a UUID and its URLs."""
    return any("unique_key" in c and not check_uuid(c) for c in checks)


def check_uuid(check: dict) -> str | None:
    """The check's UUID: `uuid` when the server sends it, else the end of its `update_url`."""
    if check.get("uuid"):
        return str(check["uuid"])
    url = check.get("update_url") or ""
    return url.rstrip("/").rsplit("/", 1)[-1] or None
