"""The transitions of a request's life, each one atomic step on the state store.

Every script exists twice, side by side: the Lua that Redis runs and the Python the
in-memory store runs. ``tests/contract/test_lifecycle_contract.py`` runs one suite against
both. Results are lists of strings, the first naming the outcome.

Fencing: ``epoch`` grows with each (re)assignment and move, and ``worker_id`` names
where the request was sent. A start or a finish must show the recorded epoch and worker,
or it is *superseded*: a worker declared dead (or frozen, or cut off by a broker outage)
whose request was given to another cannot start it, nor record its answer, afterwards.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.state.base import Script, ScriptView

_FINAL = "local final = {ok=true, failed=true, expired=true, cancelled=true}\n"
_FINAL_SET = frozenset({"ok", "failed", "expired", "cancelled"})

# -- accept ------------------------------------------------------------------------------
# A request that names its id (a client's idempotency key) is refused while the store has
# no generation marker: it lost its data and the answers are not restored yet, so the id
# of a request answered before would run it again. An id the ingress made up is new.
# KEYS: request, the generation marker. ARGV: ttl_ms, named ("1" or ""), then field,
# value pairs (status included).
# -> {"accepted"} | {"exists", field, value, ...} | {"restoring"}

_ACCEPT_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local found = redis.call('HGETALL', KEYS[1])
  table.insert(found, 1, 'exists')
  return found
end
if ARGV[2] == '1' and redis.call('EXISTS', KEYS[2]) == 0 then return {'restoring'} end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {'accepted'}
"""


def _accept(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    if view.exists(keys[0]):
        found = view.hgetall(keys[0])
        return ["exists", *(item for pair in found.items() for item in pair)]
    if args[1] == "1" and not view.exists(keys[1]):
        return ["restoring"]
    pairs = args[2:]
    view.hset(keys[0], dict(zip(pairs[0::2], pairs[1::2], strict=True)))
    view.expire(keys[0], int(args[0]) / 1000.0)
    return ["accepted"]


ACCEPT = Script("accept", _ACCEPT_LUA, _accept)

# -- accept, decided ---------------------------------------------------------------------
# A new request and its first decision in one step (the ingress placing it itself):
# the record is created assigned, and the worker's assigned set gains it.
# KEYS: request, assigned set of the worker, the generation marker. ARGV: ttl_ms,
# request_id, assigned_at_s, named, then field, value pairs (status, epoch, worker_id,
# decision included).
# -> {"accepted"} | {"exists", field, value, ...} | {"restoring"}

_ACCEPT_DECIDED_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  local found = redis.call('HGETALL', KEYS[1])
  table.insert(found, 1, 'exists')
  return found
end
if ARGV[4] == '1' and redis.call('EXISTS', KEYS[3]) == 0 then return {'restoring'} end
redis.call('HSET', KEYS[1], unpack(ARGV, 5))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
return {'accepted'}
"""


def _accept_decided(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    # An accept of the record (its ttl, flag and fields), then the worker's assigned set.
    result = _accept(view, [keys[0], keys[2]], [args[0], args[3], *args[4:]])
    if result[0] == "accepted":
        view.zadd(keys[1], {args[1]: float(args[2])})
    return result


ACCEPT_DECIDED = Script("accept-decided", _ACCEPT_DECIDED_LUA, _accept_decided)

# -- assign ------------------------------------------------------------------------------
# KEYS: request, assigned set of the new worker, assigned set it leaves (the new one's
# when none). ARGV: ttl_ms, request_id, epoch, worker_id, expect_epoch ("" for a first
# decision: the request must be queued), expect_worker ("" for any), assigned_at_s,
# decision, traceparent, tracestate.
# -> {"assigned"} | {"answered", status} | {"exists", epoch, worker, decision}
#    | {"superseded", epoch, worker} | {"missing"}

_ASSIGN_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'worker_id', 'decision')
local status, epoch, worker = r[1], r[2] or '0', r[3] or ''
if not status then return {'missing'} end
if final[status] then return {'answered', status} end
if ARGV[5] == '' then
  if status ~= 'queued' then return {'exists', epoch, worker, r[4] or ''} end
elseif epoch ~= ARGV[5] or (ARGV[6] ~= '' and worker ~= ARGV[6]) then
  return {'superseded', epoch, worker}
end
redis.call('HSET', KEYS[1], 'status', 'assigned', 'epoch', ARGV[3], 'worker_id', ARGV[4],
  'decision', ARGV[8], 'traceparent', ARGV[9], 'tracestate', ARGV[10])
redis.call('HDEL', KEYS[1], 'started_s')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if KEYS[3] ~= KEYS[2] then redis.call('ZREM', KEYS[3], ARGV[2]) end
redis.call('ZADD', KEYS[2], ARGV[7], ARGV[2])
return {'assigned'}
"""
)


def _assign(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch, worker, decision = view.hmget(
        keys[0], ("status", "epoch", "worker_id", "decision")
    )
    epoch, worker = epoch or "0", worker or ""
    if status is None:
        return ["missing"]
    if status in _FINAL_SET:
        return ["answered", status]
    if args[4] == "":
        if status != "queued":
            return ["exists", epoch, worker, decision or ""]
    elif epoch != args[4] or (args[5] != "" and worker != args[5]):
        return ["superseded", epoch, worker]
    view.hset(
        keys[0],
        {
            "status": "assigned",
            "epoch": args[2],
            "worker_id": args[3],
            "decision": args[7],
            "traceparent": args[8],
            "tracestate": args[9],
        },
    )
    view.hdel(keys[0], "started_s")
    view.expire(keys[0], int(args[0]) / 1000.0)
    if keys[2] != keys[1]:
        view.zrem(keys[2], args[1])
    view.zadd(keys[1], {args[1]: float(args[6])})
    return ["assigned"]


ASSIGN = Script("assign", _ASSIGN_LUA, _assign)

# -- start -------------------------------------------------------------------------------
# KEYS: request. ARGV: ttl_ms, epoch, worker_id, started_s.
# -> {"started"} | {"running"} | {"answered", status} | {"superseded", epoch, worker}
#    | {"missing"}

_START_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'worker_id')
local status, epoch, worker = r[1], r[2] or '0', r[3] or ''
if not status then return {'missing'} end
if final[status] then return {'answered', status} end
if epoch ~= ARGV[2] or worker ~= ARGV[3] then return {'superseded', epoch, worker} end
if status == 'running' then return {'running'} end
redis.call('HSET', KEYS[1], 'status', 'running', 'started_s', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {'started'}
"""
)


def _start(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch, worker = view.hmget(keys[0], ("status", "epoch", "worker_id"))
    epoch, worker = epoch or "0", worker or ""
    if status is None:
        return ["missing"]
    if status in _FINAL_SET:
        return ["answered", status]
    if epoch != args[1] or worker != args[2]:
        return ["superseded", epoch, worker]
    if status == "running":
        return ["running"]
    view.hset(keys[0], {"status": "running", "started_s": args[3]})
    view.expire(keys[0], int(args[0]) / 1000.0)
    return ["started"]


START = Script("start", _START_LUA, _start)

# -- finish ------------------------------------------------------------------------------
# KEYS: request, the finishing worker's assigned set, its worker hash, cluster stats.
# ARGV: ttl_ms, request_id, epoch, worker_id ("" when not a worker's answer: no fence on
# the worker, no worker counters), status, completion JSON, violated ("0"/"1"),
# recent window (how many outcomes cluster:stats keeps in "recent").
# -> {"finished"} | {"duplicate", status} | {"superseded", epoch, worker}
# A superseded answer is a run that should not have happened: the record counts it
# (superseded_runs) and so does cluster:stats (superseded). The fence comes first: an
# answer of an earlier epoch is superseded even once the record is final (its new run
# answered first), so that it is never taken for this run's own answer recorded by an
# attempt whose reply was lost, and published.

_FINISH_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'worker_id')
local status, epoch, worker = r[1], r[2] or '0', r[3] or ''
if status then
  if epoch ~= ARGV[3] or (ARGV[4] ~= '' and worker ~= ARGV[4]) then
    redis.call('HINCRBY', KEYS[1], 'superseded_runs', 1)
    redis.call('HINCRBY', KEYS[4], 'superseded', 1)
    return {'superseded', epoch, worker}
  end
  if final[status] then return {'duplicate', status} end
end
redis.call('HSET', KEYS[1], 'status', ARGV[5], 'completion', ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('HINCRBY', KEYS[3], 'completed', 1)
  if ARGV[7] == '1' then redis.call('HINCRBY', KEYS[3], 'violated', 1) end
end
redis.call('HINCRBY', KEYS[4], 'completed', 1)
if ARGV[7] == '1' then redis.call('HINCRBY', KEYS[4], 'violated', 1) end
local recent = (redis.call('HGET', KEYS[4], 'recent') or '') .. ARGV[7]
local window = tonumber(ARGV[8])
if #recent > window then recent = string.sub(recent, -window) end
redis.call('HSET', KEYS[4], 'recent', recent)
return {'finished'}
"""
)


def _finish(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch, worker = view.hmget(keys[0], ("status", "epoch", "worker_id"))
    epoch, worker = epoch or "0", worker or ""
    if status is not None:
        if epoch != args[2] or (args[3] != "" and worker != args[3]):
            view.hincrby(keys[0], "superseded_runs", 1)
            view.hincrby(keys[3], "superseded", 1)
            return ["superseded", epoch, worker]
        if status in _FINAL_SET:
            return ["duplicate", status]
    view.hset(keys[0], {"status": args[4], "completion": args[5]})
    view.expire(keys[0], int(args[0]) / 1000.0)
    violated = args[6] == "1"
    if args[3] != "":
        view.zrem(keys[1], args[1])
        view.hincrby(keys[2], "completed", 1)
        if violated:
            view.hincrby(keys[2], "violated", 1)
    view.hincrby(keys[3], "completed", 1)
    if violated:
        view.hincrby(keys[3], "violated", 1)
    recent = (view.hget(keys[3], "recent") or "") + args[6]
    window = int(args[7])
    view.hset(keys[3], {"recent": recent[-window:] if len(recent) > window else recent})
    return ["finished"]


FINISH = Script("finish", _FINISH_LUA, _finish)

# -- cancel ------------------------------------------------------------------------------
# A request whose client went away before it started: answered as cancelled, so that no
# worker starts it (its start says "answered") and no scheduler decides it again.
# KEYS: request, the assigned set of the worker the record names (any key when none).
# ARGV: ttl_ms, request_id, epoch (as read), completion JSON.
# -> {"cancelled"} | {"running"} | {"answered", status} | {"moved"} | {"missing"}
# "moved": the record's epoch changed since it was read; read it again. Not counted in
# the cluster's totals: a client's going away is not an outcome of serving.

_CANCEL_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch')
local status, epoch = r[1], r[2] or '0'
if not status then return {'missing'} end
if final[status] then return {'answered', status} end
if status == 'running' then return {'running'} end
if epoch ~= ARGV[3] then return {'moved'} end
redis.call('HSET', KEYS[1], 'status', 'cancelled', 'completion', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
return {'cancelled'}
"""
)


def _cancel(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch = view.hmget(keys[0], ("status", "epoch"))
    if status is None:
        return ["missing"]
    if status in _FINAL_SET:
        return ["answered", status]
    if status == "running":
        return ["running"]
    if (epoch or "0") != args[2]:
        return ["moved"]
    view.hset(keys[0], {"status": "cancelled", "completion": args[3]})
    view.expire(keys[0], int(args[0]) / 1000.0)
    view.zrem(keys[1], args[1])
    return ["cancelled"]


CANCEL = Script("cancel", _CANCEL_LUA, _cancel)

# -- disown ------------------------------------------------------------------------------
# An assignment that never reached its worker: the record still waits, assigned to the
# worker, for it to start, and the worker's assigned set has held it since before the
# cutoff. The epoch moves on, so the lost message can no longer start it should it turn
# up; the request stays in the worker's assigned set until it is re-assigned. An entry
# whose record is gone, answered or another worker's is only left behind: it is removed.
# KEYS: request, assigned set of the worker. ARGV: ttl_ms, request_id, worker_id,
# cutoff_s (assigned at or before).
# -> {"disowned", epoch} | {"kept"} | {"stale"}

_DISOWN_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'worker_id')
local status = r[1]
if not status or final[status] or r[3] ~= ARGV[3] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return {'stale'}
end
if status ~= 'assigned' then return {'kept'} end
local since = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not since or tonumber(since) > tonumber(ARGV[4]) then return {'kept'} end
local epoch = tostring(tonumber(r[2] or '0') + 1)
redis.call('HSET', KEYS[1], 'epoch', epoch)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {'disowned', epoch}
"""
)


def _disown(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch, worker = view.hmget(keys[0], ("status", "epoch", "worker_id"))
    if status is None or status in _FINAL_SET or worker != args[2]:
        view.zrem(keys[1], args[1])
        return ["stale"]
    if status != "assigned":
        return ["kept"]
    since = view.zscore(keys[1], args[1])
    if since is None or since > float(args[3]):
        return ["kept"]
    moved = str(int(epoch or "0") + 1)
    view.hset(keys[0], {"epoch": moved})
    view.expire(keys[0], int(args[0]) / 1000.0)
    return ["disowned", moved]


DISOWN = Script("disown", _DISOWN_LUA, _disown)

# -- restore -----------------------------------------------------------------------------
# The answer of a request whose record the store lost, read back from the answers topic:
# a final record holding it, unless the request has a record again (a retry accepted
# since, or a finish that came after the loss). A record restored pending from its
# request (:data:`RESTORE_REQUEST`) was a guess that the answer settles.
# KEYS: request. ARGV: ttl_ms, status, completion JSON, epoch, worker_id, app.
# -> {"restored"} | {"kept"}

_RESTORE_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'restored')
if r[1] and (r[2] ~= '1' or final[r[1]]) then return {'kept'} end
redis.call('HSET', KEYS[1], 'status', ARGV[2], 'completion', ARGV[3], 'epoch', ARGV[4],
  'worker_id', ARGV[5], 'app', ARGV[6], 'restored', '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return {'restored'}
"""
)


def _restore(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, restored = view.hmget(keys[0], ("status", "restored"))
    if status is not None and (restored != "1" or status in _FINAL_SET):
        return ["kept"]
    view.hset(
        keys[0],
        {
            "status": args[1],
            "completion": args[2],
            "epoch": args[3],
            "worker_id": args[4],
            "app": args[5],
            "restored": "1",
        },
    )
    view.expire(keys[0], int(args[0]) / 1000.0)
    return ["restored"]


RESTORE = Script("restore", _RESTORE_LUA, _restore)

# -- restore a request -------------------------------------------------------------------
# A request read back from the requests topics or the worker inbox (an assignment) after
# the store lost its data, in any order with the answers (:data:`RESTORE`):
# - no record: it was accepted and not answered before the loss; it is recorded again as
#   it was, queued or assigned (its worker's assigned set gains it), so that a retry
#   waits for its one answer instead of running it again, and its worker's start and
#   finish find the fence they expect;
# - a record restored from its answer without the request: the request is added, so a
#   retry with another body gets its 409;
# - a record restored pending (queued, or assigned under an earlier epoch): a later
#   assignment read back advances it (the earlier worker's set keeps a stale entry, which
#   every reader of the set drops);
# - anything else (a record made since the loss, a request started since): kept.
# KEYS: request, assigned set of the worker (the request's key when no assignment).
# ARGV: ttl_ms, request_id, epoch ("" when no assignment), worker_id, assigned_at_s,
# decision, request JSON, then the acceptance's field, value pairs (status excluded).
# -> {"pending"} | {"attached"} | {"advanced"} | {"kept"}

_RESTORE_REQUEST_LUA = (
    _FINAL
    + """
local r = redis.call('HMGET', KEYS[1], 'status', 'epoch', 'restored', 'request')
local status = r[1]
if not status then
  redis.call('HSET', KEYS[1], 'restored', '1', unpack(ARGV, 8))
  if ARGV[3] == '' then
    redis.call('HSET', KEYS[1], 'status', 'queued')
  else
    redis.call('HSET', KEYS[1], 'status', 'assigned', 'epoch', ARGV[3], 'worker_id', ARGV[4],
      'decision', ARGV[6])
    redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
  return {'pending'}
end
if r[3] ~= '1' then return {'kept'} end
if final[status] then
  if r[4] then return {'kept'} end
  redis.call('HSET', KEYS[1], 'request', ARGV[7])
  return {'attached'}
end
if ARGV[3] ~= '' and (status == 'queued'
    or (status == 'assigned' and tonumber(ARGV[3]) > tonumber(r[2] or '0'))) then
  redis.call('HSET', KEYS[1], 'status', 'assigned', 'epoch', ARGV[3], 'worker_id', ARGV[4],
    'decision', ARGV[6])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[2])
  return {'advanced'}
end
return {'kept'}
"""
)


def _restore_request(view: ScriptView, keys: Sequence[str], args: Sequence[str]) -> list[str]:
    status, epoch, restored, request = view.hmget(
        keys[0], ("status", "epoch", "restored", "request")
    )
    assigned = {"status": "assigned", "epoch": args[2], "worker_id": args[3], "decision": args[5]}
    if status is None:
        pairs = args[7:]
        fields = {"restored": "1", **dict(zip(pairs[0::2], pairs[1::2], strict=True))}
        if args[2] == "":
            fields["status"] = "queued"
        else:
            fields.update(assigned)
            view.zadd(keys[1], {args[1]: float(args[4])})
        view.hset(keys[0], fields)
        view.expire(keys[0], int(args[0]) / 1000.0)
        return ["pending"]
    if restored != "1":
        return ["kept"]
    if status in _FINAL_SET:
        if request is not None:
            return ["kept"]
        view.hset(keys[0], {"request": args[6]})
        return ["attached"]
    if args[2] != "" and (
        status == "queued" or (status == "assigned" and int(args[2]) > int(epoch or "0"))
    ):
        view.hset(keys[0], assigned)
        view.zadd(keys[1], {args[1]: float(args[4])})
        return ["advanced"]
    return ["kept"]


RESTORE_REQUEST = Script("restore-request", _RESTORE_REQUEST_LUA, _restore_request)
