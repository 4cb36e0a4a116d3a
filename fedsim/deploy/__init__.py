"""Running a federation across machines: keys, the server and client-host commands, launchers.

``fedsim run`` (:mod:`fedsim.launch.runner`) is the one-host shortcut; everything
here is for a federation whose server and client hosts are separate
processes started separately (by hand, by Slurm, by Kubernetes), joined
over TCP and authenticated with CURVE keys.
"""
