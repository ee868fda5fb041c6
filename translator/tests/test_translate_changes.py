"""A change applied to the kept translation gives what a translation of the complete inventory gives."""

from __future__ import annotations

import random

import pytest
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import Elements, diff
from stoa_translate import TranslateOptions, Translator, translate
from stoa_translate.refusal import Refusal
from stoa_translate.snapshot import ROUTE, SCOPED_ROUTE

SCOPED = TranslateOptions(route_scopes=True)
OPTIONS = (SCOPED, TranslateOptions(), TranslateOptions(route_scopes=True, audience="aud"))


def route(
    n: int, *, prefix: str = "", upstream: int = 0, auth: str = "none", tenant: str = "t"
) -> inventory_pb2.Route:
    return inventory_pb2.Route(
        route_id=f"r{n:03d}",
        tenant_id=tenant,
        api_id=f"r{n:03d}",
        path_prefix=prefix,
        methods=["GET"],
        upstream_url=f"http://10.0.0.{upstream + 1}:80",
        auth_mode=auth,
    )


def inventory(generation: int, routes: list[inventory_pb2.Route], **lists: object) -> inventory_pb2.Inventory:
    return inventory_pb2.Inventory(
        schema_version=INVENTORY_SCHEMA_VERSION,
        gateway_id="gw",
        generation=generation,
        routes=routes,
        **lists,  # type: ignore[arg-type]
    )


def changed(translator: Translator, old: inventory_pb2.Inventory, new: inventory_pb2.Inventory):  # type: ignore[no-untyped-def]
    state = Elements.of(new)
    return translator.translate_change(state, diff(old, new), base_is_latest=True)


@pytest.mark.parametrize("seed", [7, 11, 23])
@pytest.mark.parametrize("options", OPTIONS, ids=["scoped", "one-table", "scoped-native"])
def test_random_route_changes_give_the_full_translation(options: TranslateOptions, seed: int) -> None:
    rng = random.Random(seed)
    routes = {n: route(n, upstream=n % 3, auth=("jwt" if n % 4 == 0 else "none")) for n in range(40)}
    old = inventory(1, list(routes.values()))
    translator = Translator(options)
    assert translator.translate(old) == translate(old, options)
    issued = 40
    for generation in range(2, 40):
        for _ in range(rng.randint(1, 3)):
            action = rng.choice(["edit", "move", "add", "remove", "upstream", "unkeyed"])
            n = rng.choice(sorted(routes))
            if action == "edit":
                routes[n] = route(n, upstream=routes[n].upstream_url.count("2"), auth=routes[n].auth_mode)
                routes[n].methods.append("POST")
            elif action == "move":
                routes[n] = route(n, prefix=f"/apis/moved-{generation}-{n}", auth=routes[n].auth_mode)
            elif action == "unkeyed":  # a prefix of one segment: no scope key (one route table)
                routes[n] = route(n, prefix=f"/flat-{generation}-{n}", auth=routes[n].auth_mode)
            elif action == "upstream":
                routes[n] = route(n, upstream=rng.randint(0, 5), auth=routes[n].auth_mode)
            elif action == "add":
                routes[issued] = route(issued, upstream=rng.randint(0, 5))
                issued += 1
            elif len(routes) > 2:
                del routes[n]
        tombstones = [
            inventory_pb2.Tombstone(route_id=f"r{n:03d}", generation=generation)
            for n in range(issued)
            if n not in routes
        ]
        new = inventory(generation, sorted(routes.values(), key=lambda r: r.route_id), tombstones=tombstones)
        got = changed(translator, old, new)
        whole = Translator(options)
        assert got == whole.translate(new), f"generation {generation}"
        assert translator.unkeyed == whole.unkeyed, f"generation {generation}"
        old = new


def test_a_change_keeps_the_untouched_tables_and_scopes_as_they_were() -> None:
    routes = [route(n) for n in range(200)]
    old = inventory(1, routes)
    translator = Translator(SCOPED)
    before = translator.translate(old)
    moved = [*routes[1:], route(0, prefix="/apis/elsewhere")]
    after = changed(translator, old, inventory(2, moved))
    kept = {t.name: t for t in before.of(ROUTE)}
    same = [t for t in after.of(ROUTE) if kept.get(t.name) is t]
    assert len(same) >= len(after.of(ROUTE)) - 2
    assert sum(1 for s in after.of(SCOPED_ROUTE) if s in before.of(SCOPED_ROUTE)) == 199


def test_a_change_is_refused_as_the_full_translation_refuses_it() -> None:
    old = inventory(1, [route(0), route(1)])
    translator = Translator(SCOPED)
    translator.translate(old)
    clash = inventory(2, [route(0), route(1, prefix="/apis/r000")])
    with pytest.raises(Refusal) as incremental:
        changed(translator, old, clash)
    with pytest.raises(Refusal) as full:
        translate(clash, SCOPED)
    assert (incremental.value.reason, incremental.value.detail) == (full.value.reason, full.value.detail)
    # Refused: the next change is translated whole, and right.
    fine = inventory(3, [route(0), route(1, prefix="/apis/other")])
    assert changed(translator, old, fine) == translate(fine, SCOPED)
