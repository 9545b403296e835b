"""gpu-admission: a Kubernetes admission webhook for clusters of rented GPUs.

Pure policies (``webhook.policies``) run over one working copy of the admitted object (``webhook.pipeline``);
the HTTP edge (``webhook.app``, ``webhook.admission``) and the cluster snapshot (``webhook.cluster``) feed them.
"""

PREFIX = "gpu-admission.io/"
__version__ = "0.1.0"
