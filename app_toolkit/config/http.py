"""Where and how the HTTP proxy listens, and the limits it keeps."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from app_toolkit.config.allow_ips import parse_networks
from app_toolkit.config.api_keys import APIKey, check_unique, read_keys_file
from app_toolkit.config.client_tls import ClientTLS, absolute
from app_toolkit.config.ray_serve_only import drop_ray_serve_only
from app_toolkit.config.schema import Strict, explain
from app_toolkit.exceptions import ConfigError

#: The most a proxy holds of one body it forwards: what it reads ahead (up to 64 KiB, plus
#: the last piece read) before it streams the rest (``front/body.py``), with room to spare.
_ONE_BODY_HELD = 1 << 20


class HTTPOptions(Strict):
    """Where the HTTP proxy listens."""

    host: str = Field("127.0.0.1", min_length=1, description="Interface the proxy binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port; 0 picks a free one.")
    max_request_body_bytes: int = Field(
        100 << 20,
        ge=1,
        description="Largest request body accepted (it streams into the app as it arrives); "
        "bigger ones get 413.",
    )
    max_buffered_body_bytes: int = Field(
        1 << 30,
        ge=1,
        description="Request bodies one proxy holds at once, all requests together (of a body "
        "it forwards, the start it reads before streaming the rest); a request whose body would "
        "pass it gets 503 with Retry-After. At least max_request_body_bytes, or 1 MiB if that "
        "is larger.",
    )
    request_timeout_s: float | None = Field(
        None,
        gt=0,
        description="End-to-end deadline of every HTTP request, upload included (504 when it "
        "passes; 408 if the body was still arriving). A route's @deadline or the "
        "x-request-timeout-seconds header may set an earlier one.",
    )
    keep_alive_timeout_s: int = Field(
        5, ge=1, description="Seconds a connection with no request in progress stays open."
    )
    max_header_bytes: int = Field(
        16 << 10,
        ge=1024,
        description="Largest request line plus headers; a bigger request head gets 431 and the "
        "connection is closed.",
    )
    header_timeout_s: float = Field(
        10,
        gt=0,
        description="Time a request head may take to arrive from its first byte; a slower one "
        "gets 408 and the connection is closed (slowloris).",
    )
    body_timeout_s: float = Field(
        30,
        gt=0,
        description="Longest pause between two pieces of a request body; a longer one gets 408.",
    )
    max_connections: int = Field(
        4096,
        ge=1,
        description="Open client connections one proxy keeps; a new one beyond it gets 503 with "
        "Retry-After and is closed.",
    )
    websocket_max_message_bytes: int = Field(
        1 << 20,
        ge=1,
        description="Largest WebSocket message; bigger ones close the "
        "connection with 1009 (message too big).",
    )
    access_log: bool = Field(
        True,
        description="Log one line per HTTP request on the 'app_toolkit.access' logger "
        "(client, method, path, status, milliseconds; 499 when the client left first).",
    )
    request_id_headers: bool = Field(
        False,
        description="Add the request id (x-request-id) and the trace context (traceparent) "
        "to the request headers the app sees, as proxies that add them do; by default the "
        "app sees the client's headers as sent and reads the id with get_request_id().",
    )
    root_path: str = Field(
        "",
        description="Path prefix a reverse proxy in front strips before forwarding "
        "(e.g. /api): apps see it as root_path, so their links and docs include it.",
    )
    proxy_headers: bool = Field(
        True,
        description="Take the client's address and scheme from X-Forwarded-For / "
        "X-Forwarded-Proto sent by the hosts in forwarded_allow_ips.",
    )
    forwarded_allow_ips: str = Field(
        "127.0.0.1",
        description="Comma-separated addresses (or *) whose X-Forwarded-* headers are trusted.",
    )
    metrics_allow_ips: str = Field(
        "127.0.0.1,::1",
        description="Comma-separated client addresses or networks (10.0.0.0/8) that may read "
        "/-/metrics (Prometheus), or * for anyone; others get 403.",
    )
    shard_key_header: str = Field(
        "x-serve-shard-key",
        pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$",
        description="Request header whose value is the shard key: requests with the same key "
        "go to the same replica of the deployment (see its affinity option).",
    )
    dashboard_allow_ips: str = Field(
        "127.0.0.1,::1",
        description="Comma-separated client addresses or networks that may open the live "
        "status page /-/dashboard, or * for anyone; others need dashboard_token.",
    )
    dashboard_token: str | None = Field(
        None,
        min_length=16,
        description="A secret that also opens /-/dashboard from any address (?token=... once, "
        "or Authorization: Bearer ...); at least 16 characters. Unset: no token opens it.",
    )
    api_keys: tuple[APIKey, ...] = Field(
        (),
        description="API keys that open the apps' routes (name, hash: sha256:<hex>, optional "
        "expires_at); with any key here or in api_keys_file, a request without a valid key gets "
        "401. app-toolkit keys new NAME makes one.",
    )
    api_keys_file: str | None = Field(
        None,
        min_length=1,
        description="A YAML file of API keys (a list like api_keys), read again when it "
        "changes: keys are added, revoked or given an expiry without a restart. The same path "
        "on every node.",
    )
    ssl_certfile: str | None = Field(
        None,
        min_length=1,
        description="HTTPS: the server's certificate (PEM, with its chain); the proxies serve "
        "TLS 1.2 or newer on the port. The same path on every node.",
    )
    ssl_keyfile: str | None = Field(
        None, min_length=1, description="HTTPS: the certificate's private key (PEM), unless in ssl_certfile."
    )
    ssl_keyfile_password: str | None = Field(
        None, repr=False, description="HTTPS: the key file's password, if encrypted."
    )
    ssl_ca_certs: str | None = Field(
        None, min_length=1, description="HTTPS: CA certificates that sign clients' certificates."
    )
    ssl_cert_reqs: int = Field(
        0,
        ge=0,
        le=2,
        description="HTTPS: client certificates 0 not asked for, 1 optional, 2 required (uvicorn's).",
    )
    proxy_location: Literal["EveryNode", "HeadOnly", "Disabled"] = Field(
        "EveryNode",
        description="Run a proxy on every node of the cluster (each serves every app; nodes "
        "that join get one), only on the head node, or none (Disabled: handles only). "
        "Proxies on one machine share the port.",
    )

    @model_validator(mode="before")
    @classmethod
    def _ray_serve_fields(cls, data: object) -> object:
        return drop_ray_serve_only("http", data)

    @model_validator(mode="after")
    def _check_body_budget(self) -> HTTPOptions:
        least = min(self.max_request_body_bytes, _ONE_BODY_HELD)
        if self.max_buffered_body_bytes < least:
            raise ValueError(
                f"max_buffered_body_bytes must be at least {least} bytes (max_request_body_bytes, "
                "or 1 MiB if that is larger: what a proxy may hold of one body), or some requests "
                "could never be read"
            )
        return self

    @field_validator("api_keys")
    @classmethod
    def _check_api_keys(cls, keys: tuple[APIKey, ...]) -> tuple[APIKey, ...]:
        check_unique(keys)
        return keys

    @field_validator("api_keys_file")
    @classmethod
    def _check_api_keys_file(cls, path: str | None, info: ValidationInfo) -> str | None:
        """The file read now (a missing or bad one fails the start, naming it), and its
        path made absolute: every process of the cluster reads it, from its own folder."""
        if path is None:
            return None
        path = os.path.abspath(path)
        check_unique((*info.data.get("api_keys", ()), *read_keys_file(path)))
        return path

    @field_validator("ssl_certfile", "ssl_keyfile", "ssl_ca_certs")
    @classmethod
    def _absolute(cls, path: str | None) -> str | None:
        return absolute(path)

    @model_validator(mode="after")
    def _check_tls(self) -> HTTPOptions:
        """The TLS options that go together (the files are read by :func:`checked`, on the
        options as they are in the end: a config file's, with the flags over them)."""
        keys = (*self.api_keys, *(read_keys_file(self.api_keys_file) if self.api_keys_file else ()))
        named = next((key.name for key in keys if key.client_cert is not None), None)
        if named is not None and not self.ssl_cert_reqs:
            raise ValueError(
                f"API key {named!r} is named by a client certificate (client_cert): serve HTTPS "
                "that asks for one (ssl_certfile, ssl_ca_certs and ssl_cert_reqs 1 or 2)"
            )
        others = (self.ssl_keyfile, self.ssl_keyfile_password, self.ssl_ca_certs)
        if self.ssl_certfile is None:
            if any(value is not None for value in others) or self.ssl_cert_reqs:
                raise ValueError(
                    "HTTPS needs ssl_certfile (the server's certificate) with its other ssl_ options"
                )
            return self
        if self.ssl_cert_reqs and self.ssl_ca_certs is None:
            raise ValueError(
                "ssl_cert_reqs asks for client certificates: give ssl_ca_certs, the CA that signs them"
            )
        return self

    @property
    def client_tls(self) -> ClientTLS | None:
        """The proxies' HTTPS settings (None: plain HTTP)."""
        if self.ssl_certfile is None:
            return None
        return ClientTLS(
            self.ssl_certfile,
            self.ssl_keyfile,
            self.ssl_keyfile_password,
            self.ssl_ca_certs,
            self.ssl_cert_reqs,
        )

    @property
    def keys_required(self) -> bool:
        """Requests to the apps need an API key."""
        return bool(self.api_keys) or self.api_keys_file is not None

    @field_validator("metrics_allow_ips", "dashboard_allow_ips")
    @classmethod
    def _check_allow_ips(cls, value: str) -> str:
        parse_networks(value)
        return value

    @field_validator("root_path")
    @classmethod
    def _check_root_path(cls, value: str) -> str:
        if value and (not value.startswith("/") or value.endswith("/")):
            raise ValueError("must be empty or a path like '/api' (a leading '/', no trailing '/')")
        return value


def parse_http_options(options: Mapping[str, object]) -> HTTPOptions:
    """Validate proxy options (the HTTPS files read: :func:`checked`)."""
    try:
        return checked(HTTPOptions.model_validate(dict(options)))
    except ValidationError as exc:
        raise ConfigError(explain(exc, "HTTP options")) from None


def checked(http: HTTPOptions) -> HTTPOptions:
    """``http``, its HTTPS files read now where the toolkit starts: a missing or bad key
    or certificate fails the start, naming it (every proxy reads them again)."""
    tls = http.client_tls
    if tls is not None:
        tls.context()
    return http
