"""The command line and the tools around a bundle (inspect, trace export)."""
