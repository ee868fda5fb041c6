"""The routes of the objects a tenant (or, for gateway policies, a gateway) owns, written once. Each
resource is a row (`Resource`: its collection, id, names, bodies and store operations), and gets the
routes it offers of these:

    POST   <owner>/<collection>         create   201; 200 when a repeatable create found it as asked
    GET    <owner>/<collection>         list
    GET    <owner>/<collection>/{id}    get
    PUT    <owner>/<collection>/{id}    update   replaces the fields; the id is the path's
    DELETE <owner>/<collection>/{id}    delete   204

A read needs the owner to exist and a write locks it (404 naming it otherwise); who may call is the
owner's scope, which the router declares (`TenantScope`, `PlatformScope`). Another owner's object is
absent (404).
"""

# No `from __future__ import annotations` here: FastAPI reads the routes' parameter types from the
# annotations of functions made per resource, so they must be the types themselves.

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from fastapi import APIRouter, Depends, Path, Response

from stoa_cp.access import PlatformScope, TenantScope
from stoa_cp.dependencies import AppServices, Db, require_gateway_exists, require_tenant_exists
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered
from stoa_cp.store.database import Database
from stoa_cp.store.tenant_objects import Services


class Operations(Protocol):
    """What a resource's store offers its routes (`store.tenant_objects.Objects`, or its own): what
    names one object, the answer's model, whether an identical create is answered, and the calls."""

    @property
    def key(self) -> str: ...

    @property
    def model(self) -> type[Any]: ...

    @property
    def repeatable(self) -> bool: ...

    async def create(
        self, db: Database, services: Services, owner_id: str, body: Any
    ) -> tuple[Any, bool]: ...

    async def list_for(self, db: Database, owner_id: str) -> list[Any]: ...

    async def get(self, db: Database, owner_id: str, object_id: str) -> Any: ...

    async def update(
        self, db: Database, services: Services, owner_id: str, object_id: str, body: Any
    ) -> Any: ...

    async def delete(self, db: Database, services: Services, owner_id: str, object_id: str) -> None: ...


@dataclass(frozen=True)
class Owner:
    param: str  # the path parameter naming the owner
    existing: Callable[..., Any]  # the dependency that 404s when it does not exist
    prefix: str  # the path of one owner
    scope: Any  # who may call (`stoa_cp.access`)


TENANT = Owner("tenant_id", require_tenant_exists, "/v1/tenants/{tenant_id}", TenantScope)
GATEWAY = Owner("gateway_id", require_gateway_exists, "/v1/gateways/{gateway_id}", PlatformScope)


@dataclass(frozen=True)
class Resource:
    collection: str  # the path below the owner's: "/tools"
    singular: str  # route names: create_<singular>, list_<plural>, get_<singular>, ...
    plural: str
    store: Operations  # also names the path parameter of one object (its key) and the answer's model
    create_body: Any = None  # None: not offered (likewise below)
    update_body: Any = None
    get: bool = True
    delete: bool = True
    owner: Owner = TENANT
    create_responses: Mapping[int | str, dict[str, Any]] = field(default_factory=dict)
    docs: Mapping[str, str] = field(default_factory=dict)  # route → its description


def router(tag: str, *resources: Resource) -> APIRouter:
    """A router of the resources of one owner (the owner's prefix and scope, the problem bodies),
    with their routes; a resource's other routes are added to it by its module."""
    (owner,) = {resource.owner for resource in resources}
    made = APIRouter(prefix=owner.prefix, tags=[tag], dependencies=[owner.scope], responses=PROBLEM_RESPONSES)
    for resource in resources:
        mount(made, resource)
    return made


def mount(router: APIRouter, resource: Resource) -> None:
    """Add the resource's routes to `router` (whose prefix and dependencies name the owner)."""
    store = resource.store
    out = store.model
    one = f"{resource.collection}/{{{store.key}}}"
    OwnerId = Annotated[str, Path(alias=resource.owner.param)]
    Existing = Annotated[str, Depends(resource.owner.existing)]
    ObjectId = Annotated[str, Path(alias=store.key)]

    def add(route: str, path: str, method: str, endpoint: Callable[..., Any], **options: Any) -> None:
        name = resource.plural if route == "list" else resource.singular
        router.add_api_route(
            path,
            endpoint,
            methods=[method],
            name=f"{route}_{name}",
            description=resource.docs.get(route),
            **options,
        )

    if resource.create_body is not None:

        async def create(
            owner_id: OwnerId, body: resource.create_body, db: Db, services: AppServices, response: Response
        ) -> Any:
            created, is_new = await store.create(db, services, owner_id, body)
            return answered(response, created, is_new)

        responses = {**(REPEATED_CREATE if store.repeatable else {}), **resource.create_responses}
        add(
            "create",
            resource.collection,
            "POST",
            create,
            status_code=201,
            responses=responses,
            response_model=out,
        )

    async def list_all(owner_id: Existing, db: Db) -> Any:
        return await store.list_for(db, owner_id)

    add("list", resource.collection, "GET", list_all, response_model=list[out])

    if resource.get:

        async def get(owner_id: Existing, object_id: ObjectId, db: Db) -> Any:
            return await store.get(db, owner_id, object_id)

        add("get", one, "GET", get, response_model=out)

    if resource.update_body is not None:

        async def update(
            owner_id: OwnerId, object_id: ObjectId, body: resource.update_body, db: Db, services: AppServices
        ) -> Any:
            return await store.update(db, services, owner_id, object_id, body)

        add("update", one, "PUT", update, response_model=out)

    if resource.delete:

        async def delete(owner_id: OwnerId, object_id: ObjectId, db: Db, services: AppServices) -> Response:
            await store.delete(db, services, owner_id, object_id)
            return Response(status_code=204)

        add("delete", one, "DELETE", delete, status_code=204, response_model=None)
