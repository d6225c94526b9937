"""The host floor: what every domain package needs of this machine, and nothing of efabuild's
domain.

Safe filesystem access below a store root (`fsutil`), processes and their owners (`pids`,
`owner`), child processes that die with efabuild (`children`), file digests (`digest`), scratch
space (`scratch`) and the test hook that stops a make at a step boundary (`stops`). Modules here
import only the core and each other (tests/project/test_code_layout.py holds them to it).
"""
