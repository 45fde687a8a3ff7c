"""Replica providers: where a backend's model servers come from, behind one interface.

`replicas` holds the interface and the event type; each implementation lives in its own
module and is imported only by whoever configures it (`kubernetes` pulls in lightkube):

- `static.StaticProvider`: fixed OpenAI-compatible upstreams, always on.
- `process.ProcessProvider`: model-server processes this gateway starts, supervises and stops.
- `kubernetes.KubernetesProvider`: a Deployment (or any target with a scale subresource)
  scaled through the Kubernetes API, its ready endpoints read from EndpointSlices.
"""

from backends.providers.replicas import Phase, Replica, ReplicaEvent, ReplicaProvider

__all__ = ["Phase", "Replica", "ReplicaEvent", "ReplicaProvider"]
