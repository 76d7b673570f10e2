"""The admin routes: ``POST /admin/engines/{instance}/down|up|move|add|remove``, the
launcher's and operators' verdicts on engines, to loopback or unix-socket clients only
(or with an admin key). An answer says what this worker applied and the change's version
(``router.state.engine_versions``), by which every router worker orders it."""

from __future__ import annotations

import socket

import msgspec
from aiohttp import web

from router.auth import Keys, engine_key
from router.config.addresses import is_loopback
from router.config.cluster import RouterConfig
from router.dispatch.core import RouterCore
from router.dispatch.peers import MAX_REASON_CHARS
from router.proxy import Proxy
from router.request import RequestError
from router.routes.http import error_response, json_response, read_body
from router.state.engine_versions import Version


class AdminRoutes:
    """The handlers of the admin API, applied by the core's membership."""

    def __init__(self, settings: RouterConfig, keys: Keys, core: RouterCore,
                 proxy: Proxy) -> None:
        self.settings, self.keys, self.core, self.proxy = settings, keys, core, proxy

    def add_to(self, app: web.Application) -> None:
        app.router.add_post("/admin/engines/{instance}/{state}", self.engine)

    async def engine(self, request: web.Request) -> web.Response:
        """``POST /admin/engines/{instance}/down|up``: the launcher's health verdicts;
        ``.../move?url=http://HOST:PORT[&node=N]``: it restarted the engine elsewhere;
        ``.../add`` (body: the engine's cluster-file entry, with ``url``): it started one
        more replica of a served model; ``.../remove``: it drained (marked down, nothing
        in flight) and stops one."""
        if not self.keys.admin_allowed(request.headers, self._local(request)):
            return error_response(RequestError(
                403, "admin endpoints need an admin key" if self.keys.admin else
                "admin endpoints answer only on loopback and unix-socket listeners",
                type_="permission_error"))
        name, state = request.match_info["instance"], request.match_info["state"]
        membership = self.core.membership
        instances = membership.instances
        if state == "add" and name not in instances:
            return await self._add(request, name)
        if state not in ("up", "down", "move", "remove") or name not in instances:
            return error_response(RequestError(
                404, f"no engine instance '{name}' (known: {', '.join(instances)}) or action "
                f"'{state}' (up, down, move, add, remove)", code="not_found"))
        if state == "remove":
            try:
                version = await membership.admin_remove(name)
            except ValueError as exc:
                return error_response(RequestError(409, str(exc), code="conflict"))
            self.proxy.forget(name)
            return json_response({"instance": name, "removed": True,
                                  "version": _version(version)})
        if state == "move":
            url = request.query.get("url", "")
            try:
                version = membership.admin_move(name, url, request.query.get("node"))
            except ValueError as exc:
                return error_response(RequestError(400, str(exc), param="url"))
            return json_response({"instance": name, "url": self.core.state.table[name].url,
                                  "node": membership.nodes.get(name),
                                  "version": _version(version)})
        reason = request.query.get("reason", "admin")
        if len(reason) > MAX_REASON_CHARS:  # the other workers could not take it
            return error_response(RequestError(
                400, f"reason: at most {MAX_REASON_CHARS} characters", param="reason"))
        version = membership.admin_mark(name, state == "up", reason)
        return json_response({"instance": name, "up": state == "up", "reason": reason,
                              "version": _version(version)})

    async def _add(self, request: web.Request, name: str) -> web.Response:
        try:
            entry = msgspec.json.decode(await read_body(request.content))
        except (msgspec.MsgspecError, RecursionError, UnicodeDecodeError) as exc:
            return error_response(RequestError(400, f"the body must be a JSON object: {exc}"))
        if not isinstance(entry, dict) or entry.get("name") != name:
            return error_response(RequestError(
                400, f"the body must be the engine's entry, a JSON object with \"name\": "
                f"\"{name}\"", param="name"))
        try:
            if isinstance(env := entry.get("api_key_env"), str):
                engine_key(name, env)  # its key must be here before anything routes to it
            inst, version = self.core.membership.admin_add(entry)
        except ValueError as exc:  # ConfigError, KeysError
            return error_response(RequestError(400, str(exc)))
        return json_response({"instance": inst.name, "url": inst.url,
                              "model": inst.served_model_name, "node": inst.node,
                              "version": _version(version)})

    def _local(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None:
            return False
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family == socket.AF_UNIX:
            return True
        peer = transport.get_extra_info("peername")
        return (is_loopback(self.settings.host) and isinstance(peer, tuple)
                and is_loopback(peer[0]))


def _version(version: Version) -> list[int]:
    """A change's version as the answer shows it: ``[counter, worker]`` (the change holds
    in every router worker unless one with a higher version was made at once elsewhere)."""
    return [version.counter, version.worker]
