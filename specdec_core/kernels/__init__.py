"""specdec's C library: its sources (``csrc/``), how they are built (``build_definition``, read by
setup.py too) and the ctypes binding the rest of the core calls (``c_library``). The lowest
package of the core: it imports nothing of specdec's but itself."""
