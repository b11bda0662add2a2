# Run by every Python kernel of SPACE's code interpreter at start
# (IPKernelApp.exec_files): registers the "e2b/data" display format the
# @e2b/code-interpreter SDK reads as Result.data (a DataFrame's columns).
import math
import sys

import IPython
from IPython.core.formatters import BaseFormatter
from traitlets import ObjectName, Unicode


def _plain(v, pandas):
    if isinstance(v, pandas.Timestamp):
        return v.isoformat()
    if isinstance(v, float) and math.isnan(v):
        return None  # JSON has no NaN
    if hasattr(v, "item"):  # numpy scalars
        try:
            return _plain(v.item(), pandas)
        except (TypeError, ValueError):
            pass
    return v


class SpaceDataFormatter(BaseFormatter):
    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj):
        # Only a DataFrame (which needs pandas already imported): other
        # results must not pay for importing pandas.
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        cols = obj.to_dict(orient="list")
        return {str(k): [_plain(v, pandas) for v in vals] for k, vals in cols.items()}


_ip = IPython.get_ipython()
if _ip is not None:
    _ip.display_formatter.formatters["e2b/data"] = SpaceDataFormatter(parent=_ip.display_formatter)
del _ip
