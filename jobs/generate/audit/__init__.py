"""`eyrie audit`: tools as text vs structured on a sample (bought once, kept), or on recorded
answers (`--from`), and the figures and verdict of both."""
