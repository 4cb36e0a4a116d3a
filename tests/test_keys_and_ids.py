"""Client-id ranges and the CURVE key files `fedsim keys` writes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from fedsim.deploy.keys import (
    KeysError,
    load_allowed,
    load_client_keys,
    load_server_keys,
    make_keys,
)
from fedsim.scenario.ids import format_id_list, format_ids, parse_id_list, parse_ids, split_ids


@pytest.mark.parametrize(("text", "ids"), [
    ("0-4", [0, 1, 2, 3, 4]), ("7", [7]), ("0-1, 5,3", [0, 1, 3, 5]), ("2-2,2", [2]),
])
def test_parse_ids(text: str, ids: list[int]) -> None:
    assert parse_ids(text) == ids
    assert parse_ids(format_ids(ids)) == ids


@pytest.mark.parametrize(("text", "message"), [
    ("a-b", "bad id range 'a-b'"), ("5-2", "want 0 <= first <= last"), ("-3", "bad id range"),
    ("", "no client ids"), ("0-10", "goes past the scenario's 10 clients"),
])
def test_parse_ids_names_the_bad_part(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_ids(text, limit=10)


@pytest.mark.parametrize(("ids", "text"), [
    ([], ""), ([4], "4"), ([0, 2], "0,2"), ([0, 1, 2, 5], "0,1,2,5"), ([3, 2, 1], "3,2,1"),
    (list(range(7, 700, 7)), "7:694:7"), (list(range(1, 50_000, 2)), "1:50000:2"),
])
def test_id_lists_for_a_command_line_round_trip(ids: list[int], text: str) -> None:
    assert format_id_list(ids) == text
    assert parse_id_list(text) == ids


def test_a_hosts_share_of_50000_clients_fits_one_argument() -> None:
    """Linux caps one argument at 128 KB; 25,000 ids written out took 140 KB."""
    share = list(range(1, 50_000, 2))
    assert format_id_list(share) == "1:50000:2"
    assert len(",".join(map(str, share))) > 128 * 1024


def test_split_ids_is_even_and_covers_every_client() -> None:
    parts = split_ids(10, 3)
    assert parts == ["0-3", "4-6", "7-9"]
    assert sorted(i for p in parts for i in parse_ids(p)) == list(range(10))
    with pytest.raises(ValueError, match="cannot split 2 clients into 3 hosts"):
        split_ids(2, 3)


def test_make_keys_writes_pairs_and_an_allow_list(tmp_path: Path) -> None:
    made = make_keys(tmp_path, hosts=2, num_clients=10)
    assert [(h.name, h.ids) for h in made] == [("host-0", tuple(range(5))),
                                               ("host-1", tuple(range(5, 10)))]
    for name in ("server", "host-0", "host-1"):
        mode = stat.S_IMODE(os.stat(tmp_path / f"{name}.key_secret").st_mode)
        assert mode == 0o600, (name, oct(mode))
    keys, allowed = load_server_keys(tmp_path, num_clients=10)
    assert {n: h for h, n in keys.allowed.items()} == {h.name: h.public for h in made}
    client = load_client_keys(tmp_path, "host-1")
    assert client.server == keys.public
    assert client.public == made[1].public
    assert [h.ids for h in allowed] == [h.ids for h in made]
    with pytest.raises(KeysError, match="already holds keys"):
        make_keys(tmp_path, hosts=2, num_clients=10)


def test_bad_allow_lists_name_the_entry(tmp_path: Path) -> None:
    make_keys(tmp_path, hosts=2, num_clients=10, ranges=["0-4", "5-9"])
    path = tmp_path / "allowed.toml"
    good = path.read_text()
    path.write_text(good.replace('ids = "5-9"', 'ids = "4-9"'))
    with pytest.raises(KeysError, match=r"host\[1\]: client 4 is also host-0's"):
        load_allowed(tmp_path)
    path.write_text(good.replace('ids = "5-9"', 'ids = "5-19"'))
    with pytest.raises(KeysError, match=r"host\[1\]: ids: id range '5-19' goes past"):
        load_allowed(tmp_path, num_clients=10)
    key = made_key = good.split('public_key = "')[1][:40]
    path.write_text(good.replace(made_key, key[:-3]))
    with pytest.raises(KeysError, match="not a 40-character Z85 CURVE key"):
        load_allowed(tmp_path)
    path.write_text("")
    with pytest.raises(KeysError, match="no host could join"):
        load_allowed(tmp_path)
    with pytest.raises(KeysError, match=r"host-7\.key_secret not found"):
        load_client_keys(tmp_path, "host-7")
    with pytest.raises(KeysError, match="overlap"):
        make_keys(tmp_path / "other", hosts=2, num_clients=10, ranges=["0-5", "5-9"])
