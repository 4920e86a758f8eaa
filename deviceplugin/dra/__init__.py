"""DRA driver (``resource.k8s.io/v1``): a kubelet plugin beside the device plugin, over the same resource
manager (:func:`deviceplugin.resources.build_plan`); each device is served by exactly one of the two.

Pure: ``config`` (the ``dra`` config section), ``slices`` (the node's ResourceSlices from the
inventory), ``prepare.devices_for`` (what a claim's allocation gives the container).
Adapters: ``checkpoint`` (prepared claims on disk, atomic), ``prepare`` (idempotent prepare/unprepare
over the checkpoint), ``server`` (the ``v1.DRAPlugin``, ``DRAResourceHealth`` ``v1`` and ``v1alpha1``,
and plugin registration gRPC services on unix sockets), ``publish`` (server-side apply of the slices through
:mod:`topology.kube`), ``driver`` (the node component that keeps all of it true).

Owns ``deviceplugin/dra/api`` (our ``.proto`` files and generated stubs; only ``server`` imports them).
Imports ``deviceplugin`` and ``topology`` only: nothing of ``agent``.
"""
