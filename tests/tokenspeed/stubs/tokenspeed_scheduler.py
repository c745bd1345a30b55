"""Test stub of tokenspeed_scheduler (tokenspeed's C++ scheduler extension): the PD events and
the Forward.Batch an executor is given, shaped as tokenspeed's Python code uses them. The test
builds the batches a scheduler would (tokenspeed_test_env.py)."""


class _Event:
    def __init__(self, request_id, *args):
        self.request_id = request_id
        self.args = args

    def __repr__(self):
        return "%s(%r%s)" % (type(self).__name__, self.request_id,
                             "".join(", %r" % a for a in self.args))

    def __eq__(self, other):
        return type(self) is type(other) and (self.request_id, self.args) == (
            other.request_id, other.args)


class PD:
    class BootstrappedEvent(_Event):
        pass

    class SucceededEvent(_Event):
        pass

    class FailedEvent(_Event):
        pass

    class RemotePrefillDoneEvent(_Event):
        def __init__(self, request_id, bootstrap_token):
            super().__init__(request_id, bootstrap_token)
            self.bootstrap_token = bootstrap_token


class Forward:
    class Batch:
        """A forward op: its request rows, the first `extends` of them extend (prefill)
        rows, with their block tables per KV cache group ({group_id: int array
        [rows, slots]})."""

        def __init__(self, request_ids, extends, extend_prefix_lens=(), input_lengths=(),
                     prefill_lengths=(), request_pool_indices=(), block_tables=None,
                     local_prefill=False):
            self.request_ids = list(request_ids)
            self._extends = extends
            self.extend_prefix_lens = list(extend_prefix_lens)
            self.input_lengths = list(input_lengths)
            self.prefill_lengths = list(prefill_lengths)
            self.request_pool_indices = list(request_pool_indices)
            self._block_tables = block_tables or {}
            self._local_prefill = local_prefill

        def num_extends(self):
            return self._extends

        def block_tables_arrays(self):
            return self._block_tables

        def is_local_prefill(self):
            return self._local_prefill


class ForwardEvent:
    class Abort:
        def __init__(self):
            self.request_id = ""


def __getattr__(name):
    """What else tokenspeed's modules import from the extension (the event loop's Cache,
    Scheduler, ...): placeholders, never run by the test."""
    from lenient import placeholder

    value = placeholder(name)
    globals()[name] = value
    return value
