"""Building a kernel's extension: the repository's recipe, compiled object by object.

`builder` runs the compiles and links; `stage` lays out what they read; `flags`
plans the commands; `registrations` renames each build's namespaces; `toolkit`
finds nvcc and the target architectures; `model` holds the records they exchange;
`cpp_extension` is the one module that talks to `torch.utils.cpp_extension`;
`diagnostics` turns compiler output into records. `repository` builds the original
under its real names for the repository's own tests; `symbols` finds which built
library holds a kernel.

    layouts/  the layouts the builder treats apart (load_inline, kernel-builder, own)
    fast/     the fast path: a candidate's kernel compiled alone

It may import the sandbox, the capture's staging records and the scan's records.
"""

from kfbot.evaluate.build.builder import Builder as Builder
from kfbot.evaluate.build.model import BuildRequest as BuildRequest
from kfbot.evaluate.build.model import BuildResult as BuildResult
from kfbot.evaluate.build.model import module_name as module_name
from kfbot.evaluate.build.registrations import rename_registrations as rename_registrations
from kfbot.evaluate.build.toolkit import arch_list as arch_list
from kfbot.evaluate.build.toolkit import find_toolkit as find_toolkit
