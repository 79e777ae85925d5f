"""Renderings of results for people and tools (terminal table; more formats build on ``Result``)."""
