"""Build hook: puts the repository's shared files into the sdist and the wheel without keeping copies of them.

The Lua fallback (lua/tb.lua, shared with the npm package) and LICENSE live at the repository root, two folders up.
Building from the repository takes them from there; an sdist carries them (src/redis_tb/tb.lua and LICENSE), so
building a wheel from the unpacked sdist alone finds them in the sdist itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class SharedFilesHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = Path(self.root)
        repository = root.parent.parent
        lua = {"sdist": "src/redis_tb/tb.lua", "wheel": "redis_tb/tb.lua"}[self.target_name]
        for shared, packaged, inside in (
            (repository / "lua" / "tb.lua", root / "src" / "redis_tb" / "tb.lua", lua),
            (repository / "LICENSE", root / "LICENSE", "LICENSE"),
        ):
            if packaged.is_file():
                # Building from an unpacked sdist: the file is already where the build takes it from.
                continue
            if not shared.is_file():
                raise FileNotFoundError(f"{shared} is missing: build from the repository or from the sdist")
            if inside == "LICENSE" and self.target_name == "wheel":
                # A wheel's license files go in its .dist-info/licenses/.
                build_data.setdefault("extra_metadata", {})[str(shared)] = "licenses/LICENSE"
            else:
                build_data["force_include"][str(shared)] = inside
