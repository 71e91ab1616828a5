"""The routes and the deployment, in process."""

from __future__ import annotations

import app_toolkit as tk


def test_hello(client: tk.testing.TestClient) -> None:
    response = client.get("/hello/world")
    assert response.status_code == 200
    assert response.json() == {"message": "Hi, world!"}


def test_post_validates_its_body(client: tk.testing.TestClient) -> None:
    assert client.post("/greetings", json={"name": "Ada"}).json() == {"message": "Hi, Ada!"}
    assert client.post("/greetings", json={"name": ""}).status_code == 422


def test_calls_reach_the_deployment(client: tk.testing.TestClient) -> None:
    for name in ("a", "b", "c"):
        client.get(f"/hello/{name}")
    greeter = tk.get_deployment_handle("Greeter", "{{ cookiecutter.project_slug }}")
    assert greeter.count.remote().result(timeout_s=10) == 3
