"""Plane shapes: vectors, rectangles, polygons."""
