"""Header, cookie and query models, validation error bodies, cookies set and deleted."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import Body, Cookie, FastAPI, Header, Query, Response
from pydantic import BaseModel, ConfigDict, Field

from tests.fidelity.compare import Http


class StrictHeaders(BaseModel):
    """Every header the client sent must be declared here (extra="forbid")."""

    model_config = ConfigDict(extra="forbid")

    host: str
    accept: str
    accept_encoding: str
    connection: str
    user_agent: str
    x_token: str
    x_tags: list[str] = []


class LooseHeaders(BaseModel):
    x_token: str = "none"
    x_tags: list[str] = []


class Session(BaseModel):
    model_config = ConfigDict(extra="forbid")

    session_id: str
    theme: str = "light"


class Paging(BaseModel):
    limit: int = Field(10, gt=0, le=100)
    offset: int = 0
    tags: list[str] = []


class Item(BaseModel):
    name: str = Field(min_length=2)
    price: float = Field(gt=0)
    tags: set[str] = set()


app = FastAPI(title="models")


@app.get("/headers/strict")
async def strict(headers: Annotated[StrictHeaders, Header()]) -> StrictHeaders:
    return headers


@app.get("/headers/loose")
async def loose(headers: Annotated[LooseHeaders, Header()]) -> LooseHeaders:
    return headers


@app.get("/cookies")
async def cookies(session: Annotated[Session, Cookie()]) -> Session:
    return session


@app.get("/query")
async def query(paging: Annotated[Paging, Query()]) -> Paging:
    return paging


@app.post("/items/{item_id}")
async def create(item_id: int, item: Item, note: Annotated[str, Body(max_length=5)] = "") -> dict[str, Any]:
    return {"item_id": item_id, "item": item, "note": note}


@app.get("/set-cookies")
async def set_cookies(response: Response) -> str:
    response.set_cookie("plain", "1")
    response.set_cookie(
        "full",
        "two words",
        max_age=60,
        path="/p",
        domain="fidelity.test",
        secure=True,
        httponly=True,
        samesite="strict",
    )
    response.set_cookie("expiring", "x", expires="Thu, 01 Jan 2099 00:00:00 GMT")
    response.delete_cookie("gone")
    response.set_cookie("plain", "2")  # the same name twice: order matters
    return "cookies set"


@app.get("/raw-json")
async def raw_json() -> Response:
    return Response(json.dumps({"b": 1, "a": [1.5, None]}), media_type="application/json")


EXCHANGES = [
    Http(
        "strict header model, every header declared",
        path="/headers/strict",
        headers=[("x-token", "t"), ("x-tags", "a"), ("x-tags", "b")],
    ),
    Http(
        "strict header model, an extra header",
        path="/headers/strict",
        headers=[("x-token", "t"), ("x-extra", "e")],
    ),
    Http("strict header model, a header missing", path="/headers/strict"),
    Http("loose header model", path="/headers/loose", headers=[("x-token", "t"), ("x-tags", "c")]),
    Http("cookie model", path="/cookies", headers=[("cookie", "session_id=abc; theme=dark")]),
    Http("cookie model, an extra cookie", path="/cookies", headers=[("cookie", "session_id=abc; other=1")]),
    Http("cookie model, cookie missing", path="/cookies"),
    Http("query model", path="/query?limit=5&tags=a&tags=b"),
    Http("query model, out of bounds", path="/query?limit=500&offset=x"),
    Http(
        "body model",
        method="POST",
        path="/items/3",
        headers=[("content-type", "application/json")],
        body=b'{"item": {"name": "pen", "price": 2, "tags": ["a"]}, "note": "hi"}',
    ),
    Http(
        "body model, invalid fields",
        method="POST",
        path="/items/x",
        headers=[("content-type", "application/json")],
        body=b'{"item": {"name": "p", "price": -1}, "note": "too long"}',
    ),
    Http(
        "body, malformed JSON",
        method="POST",
        path="/items/1",
        headers=[("content-type", "application/json")],
        body=b'{"item": ',
    ),
    Http("body, missing", method="POST", path="/items/1"),
    Http("cookies set and deleted", path="/set-cookies"),
    Http("raw JSON response", path="/raw-json"),
]
