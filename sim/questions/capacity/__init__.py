"""Minimum capacity: the smallest device that runs a trace without OOM (``minimum``), decided
by ``oracle`` (does a trace complete at capacity c?), with what one replay says about other
capacities (``regions``) and a trace that repeats itself (``period``). This package imports
nothing itself: import the module you need."""
