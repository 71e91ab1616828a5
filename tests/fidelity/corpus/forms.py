"""Forms and uploads: URL-encoded and multipart bodies, form models, files (FastAPI reads
forms with python-multipart, a dev dependency)."""

from typing import Annotated, Any

from fastapi import FastAPI, File, Form, UploadFile
from pydantic import BaseModel, ConfigDict

from tests.fidelity.compare import Http


class Login(BaseModel):
    model_config = ConfigDict(extra="forbid")

    username: str
    password: str
    remember: bool = False


app = FastAPI(title="forms")


@app.post("/login")
async def login(data: Annotated[Login, Form()]) -> dict[str, Any]:
    return {"username": data.username, "remember": data.remember}


@app.post("/upload")
async def upload(note: Annotated[str, Form()], files: Annotated[list[UploadFile], File()]) -> dict[str, Any]:
    described = []
    for upload in files:
        content = await upload.read()
        described.append({"name": upload.filename, "type": upload.content_type, "size": len(content)})
    return {"note": note, "files": described}


BOUNDARY = "fidelity-boundary"


def multipart(*parts: tuple[str, str | None, str | None, bytes]) -> bytes:
    """A multipart/form-data body of (field, filename, content type, content) parts, with a
    fixed boundary (a client's would be random)."""
    body = b""
    for field, filename, content_type, content in parts:
        disposition = f'form-data; name="{field}"' + (f'; filename="{filename}"' if filename else "")
        body += f"--{BOUNDARY}\r\ncontent-disposition: {disposition}\r\n".encode()
        if content_type:
            body += f"content-type: {content_type}\r\n".encode()
        body += b"\r\n" + content + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


FORM = ("content-type", "application/x-www-form-urlencoded")
MULTIPART = ("content-type", f"multipart/form-data; boundary={BOUNDARY}")
EXCHANGES = [
    Http(
        "form model",
        method="POST",
        path="/login",
        headers=[FORM],
        body=b"username=ann&password=pw&remember=on",
    ),
    Http(
        "form model, extra field",
        method="POST",
        path="/login",
        headers=[FORM],
        body=b"username=a&password=p&x=1",
    ),
    Http("form model, missing field", method="POST", path="/login", headers=[FORM], body=b"username=ann"),
    Http(
        "two files and a field",
        method="POST",
        path="/upload",
        headers=[MULTIPART],
        body=multipart(
            ("note", None, None, "café".encode()),
            ("files", "a.txt", "text/plain", b"alpha"),
            ("files", "b.bin", "application/octet-stream", bytes(300_000)),
        ),
    ),
    Http(
        "no file",
        method="POST",
        path="/upload",
        headers=[MULTIPART],
        body=multipart(("note", None, None, b"x")),
    ),
    Http(
        "not a form", method="POST", path="/upload", headers=[("content-type", "text/plain")], body=b"note=x"
    ),
]
