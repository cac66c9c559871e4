"""Leases as client-go's leader election uses them: four candidates take a
coordination.k8s.io/v1 Lease with read-then-replace (the read's resourceVersion is the
precondition, a 409 sends the candidate back to read). Every acknowledged replace must count:
at the end `leaseTransitions` equals the number of acknowledged takeovers, which a server that
let a stale replace through would break (two takeovers from one read, one of them lost).

Usage: lease_race.py KUBECONFIG [KUBECONFIG…]: candidate i talks to the agent of kubeconfig
i mod n. Prints "lease race: every takeover counted". Optimistic concurrency holds per agent
(DESIGN.md §5: a resourceVersion is an agent's commit sequence); candidates spread over
several agents race each other's writes through the store's last-writer-wins merge, and this
script then reports the takeovers lost (see README, Limits).
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
apis[0].create_namespaced_lease("default", client.V1Lease(
    metadata=client.V1ObjectMeta(name="leader"),
    spec=client.V1LeaseSpec(holder_identity="nobody", lease_duration_seconds=15,
                            acquire_time=now(), renew_time=now(), lease_transitions=0)))

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
