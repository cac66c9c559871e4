"""Leases as client-go's leader election uses them. First every candidate creates the
coordination.k8s.io/v1 Lease at once (a candidate that finds none creates it): exactly one
create may succeed, the others get 409 AlreadyExists. Then four candidates take the Lease with
read-then-replace (the read's resourceVersion is the precondition, a 409 sends the candidate
back to read). Every acknowledged replace must count: at the end `leaseTransitions` equals the
number of acknowledged takeovers, which a server that let a stale replace through would break
(two takeovers from one read, one of them lost).

Usage: lease_race.py KUBECONFIG [KUBECONFIG…]: candidate i talks to the agent of kubeconfig
i mod n. Prints "lease race: every takeover counted". With several agents, creates and
preconditioned writes are decided by the Lease's home node (DESIGN.md §5), so this holds
through any agent.
"""
import datetime
import sys
import threading

from kubernetes import client, config

ROUNDS = 40


def coordination(path):
    c = client.Configuration()
    config.load_kube_config(config_file=path, client_configuration=c)
    return client.CoordinationV1Api(client.ApiClient(configuration=c))


apis = [coordination(p) for p in sys.argv[1:]]
now = lambda: datetime.datetime.now(datetime.timezone.utc)

created = []
refused = []
start = threading.Barrier(4)


def create(i):
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="nobody", lease_duration_seconds=15,
                                acquire_time=now(), renew_time=now(), lease_transitions=0))
    start.wait()
    try:
        apis[i % len(apis)].create_namespaced_lease("default", lease)
        created.append(i)
    except client.exceptions.ApiException as e:
        refused.append((i, e.status, e.reason))


creators = [threading.Thread(target=create, args=(i,)) for i in range(4)]
for t in creators:
    t.start()
for t in creators:
    t.join()
assert len(created) == 1, f"{len(created)} creates of one Lease acknowledged: {created}, refused {refused}"
assert all(status == 409 for _, status, _ in refused), refused

taken = [0, 0, 0, 0]
conflicts = [0]
errors = []


def candidate(i):
    api = apis[i % len(apis)]
    me = f"candidate-{i}"
    try:
        for _ in range(ROUNDS):
            while True:
                lease = api.read_namespaced_lease("leader", "default")
                lease.spec.holder_identity = me
                lease.spec.acquire_time = now()
                lease.spec.renew_time = now()
                lease.spec.lease_transitions = (lease.spec.lease_transitions or 0) + 1
                try:
                    api.replace_namespaced_lease("leader", "default", lease)
                    taken[i] += 1
                    break
                except client.exceptions.ApiException as e:
                    if e.status != 409:
                        raise
                    conflicts[0] += 1
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(f"{me}: {e!r}")


threads = [threading.Thread(target=candidate, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
assert not errors, errors
final = apis[-1].read_namespaced_lease("leader", "default")
assert final.spec.lease_transitions == sum(taken) == 4 * ROUNDS, (final.spec.lease_transitions, taken)
assert final.spec.holder_identity.startswith("candidate-"), final.spec.holder_identity
assert isinstance(final.spec.renew_time, datetime.datetime), final.spec.renew_time
print(f"lease race: every takeover counted ({sum(taken)} takeovers, {conflicts[0]} conflicts sent back)")
