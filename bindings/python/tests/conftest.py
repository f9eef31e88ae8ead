"""Shared by every test file."""

import signal

# A shell starts a background job (`scripts/test-python.sh &`) with SIGINT
# ignored, and an ignored signal stays ignored across exec: the children
# the tests interrupt with SIGINT (an acquire cancelled by Ctrl-C, etcdctl
# resigning) would never see it. A handler of our own is reset to the
# default in every child, so they get SIGINT as a terminal would send it.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
