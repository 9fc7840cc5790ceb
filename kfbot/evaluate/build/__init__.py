"""Building a kernel's extension: the repository's recipe, compiled object by object.

`builder` runs the compiles and links; `stage` lays out what they read; `flags`
plans the commands; `registrations` renames each build's namespaces; `toolkit`
finds nvcc and the target architectures; `model` holds the records they exchange.
"""

from kfbot.evaluate.build.builder import Builder as Builder
from kfbot.evaluate.build.model import BuildRequest as BuildRequest
from kfbot.evaluate.build.model import BuildResult as BuildResult
from kfbot.evaluate.build.model import module_name as module_name
from kfbot.evaluate.build.registrations import rename_registrations as rename_registrations
from kfbot.evaluate.build.toolkit import arch_list as arch_list
from kfbot.evaluate.build.toolkit import find_toolkit as find_toolkit
