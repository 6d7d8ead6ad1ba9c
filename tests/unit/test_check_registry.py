"""Rules registered one way: every rule module lists its own rules, the registry names the
modules, a rule's code tells its file (docs/check.md), shared helpers are public, and the
engine imports no rule module."""

from __future__ import annotations

import ast
import pkgutil
import re
from pathlib import Path

import splitsync.check.rules as rules_package
from splitsync.check.registry import RULE_MODULES, all_rules

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "src" / "splitsync" / "check"
DOCS = ROOT / "docs" / "check.md"


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.append((node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            out.extend((a.name, []) for a in node.names)
    return out


def test_every_rule_module_is_registered_and_lists_only_its_own_rules() -> None:
    names = {m.name for m in pkgutil.iter_modules(rules_package.__path__)}
    registered = {m.__name__.rsplit(".", 1)[-1] for m in RULE_MODULES}
    assert names - {"common"} == registered  # common holds helpers, no rules
    for module in RULE_MODULES:
        assert module.RULES, module.__name__
        for rule in module.RULES:
            assert rule.check.__module__ == module.__name__, (rule.code, module.__name__)
    codes = [r.code for m in RULE_MODULES for r in m.RULES]
    assert len(codes) == len(set(codes)) == len(all_rules())


def test_no_module_glues_or_reassigns_rules() -> None:
    for path in (CHECK / "rules").glob("*.py"):
        tree = ast.parse(path.read_text())
        assigned = [n for n in tree.body if isinstance(n, ast.Assign)
                    and any(isinstance(t, ast.Name) and t.id == "RULES" for t in n.targets)]
        assert len(assigned) <= 1, path.name
        for node in assigned:
            starred = [s.value for s in ast.walk(node.value) if isinstance(s, ast.Starred)]
            assert not any(isinstance(v, ast.Attribute) and v.attr == "RULES"
                           or isinstance(v, ast.Name) and v.id == "RULES" for v in starred), path.name


def test_the_engine_imports_no_rule_module_and_helpers_are_public() -> None:
    rule_modules = {m.__name__ for m in RULE_MODULES}
    engine = [p for p in CHECK.glob("*.py") if p.name != "registry.py"]  # it names them
    for path in engine:
        for module, names in _imports(path):
            assert module not in rule_modules, f"{path.name} imports {module}"
            if module == "splitsync.check.rules":
                assert not set(names) & {m.__name__.rsplit(".", 1)[-1] for m in RULE_MODULES}, \
                    f"{path.name} imports a rule module"
    for path in [*CHECK.glob("*.py"), *(CHECK / "rules").glob("*.py")]:
        if path.name == "registry.py":
            continue  # the registry names the modules: that is its job
        for module, names in _imports(path):
            if module.startswith("splitsync.check"):
                private = [n for n in names if n.startswith("_") and n != "__future__"]
                assert not private, f"{path.name} imports private {private} from {module}"
                assert module not in rule_modules or path.parent.name != "rules", \
                    f"{path.name} imports the rule module {module}"


def test_docs_table_maps_every_code_to_its_file() -> None:
    text = DOCS.read_text()
    section = text.split("## Where each rule lives", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| (SS\d{3}) \| `check/rules/(\w+)\.py` \|", section, re.M))
    actual = {r.code: r.check.__module__.rsplit(".", 1)[-1] for r in all_rules()}
    assert table == actual
