"""Scripted-policy checks: a method's real controllers and reward path run against a scripted
stand-in policy (no model compiled), and the HarnessRL critic's power on one."""
