"""The ``primus-safe`` command line: runs services, the embedded stack, and
the operator verbs. It may import services (to run them); services never
import it."""
