"""Metadata lives in setup.cfg. This file only adds the ``TRL_COMPAT_AUTO`` start-up files
(``trl_compat.pth``, ``trl_compat.start`` and the module they call, ``_trl_compat_auto.py``)
to the wheel's root, i.e. to site-packages, where ``site`` reads them at interpreter start.
setuptools has no declarative way to put a file there."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

SITE_FILES_DIR = os.path.join("trl_compat", "activation", "site_files")
SITE_FILES = ("trl_compat.pth", "trl_compat.start", "_trl_compat_auto.py")


class build_py_with_site_files(build_py):
    def run(self):
        super().run()
        for name in SITE_FILES:
            self.copy_file(os.path.join(SITE_FILES_DIR, name), os.path.join(self.build_lib, name), preserve_mode=False)

    def get_outputs(self, *args, **kwargs):
        return list(super().get_outputs(*args, **kwargs)) + [os.path.join(self.build_lib, n) for n in SITE_FILES]

    def get_source_files(self):  # what sdist ships
        return list(super().get_source_files()) + [os.path.join(SITE_FILES_DIR, n) for n in SITE_FILES]


setup(cmdclass={"build_py": build_py_with_site_files})
