"""The op tables of the protocol module list exactly the ops the worker serves, and every op's
definition is a well-formed typed message (one definition each: protocol, handlers, SDK, fuzzer)."""

from gpu_worker import ops, protocol


def test_admin_ops_table_matches_the_handlers() -> None:
    assert set(ops.ADMIN_HANDLERS) == set(protocol.ADMIN_OPS)


def test_lip_ops_table_matches_the_handlers() -> None:
    # ``hello`` is the connection's handshake and ``pred`` is relayed without a Task (ops/pred.py).
    assert ops.RELAYED == {"hello", "pred"}
    assert set(ops.LIP_HANDLERS) | ops.RELAYED == set(protocol.LIP_OPS)
    assert not ops.RELAYED & set(ops.LIP_HANDLERS)


def test_every_op_is_named_by_its_own_definition() -> None:
    for table in (protocol.LIP_OPS, protocol.ADMIN_OPS):
        for name, args in table.items():
            assert args.OP == name
            assert issubclass(args, protocol.Args)
