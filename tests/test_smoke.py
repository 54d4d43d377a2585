def test_a_deployed_copy_imports_its_own_code_not_the_checkout(sqlite_project):
    result = sqlite_project.manage("shell", "-c", "import ops; print(ops.__file__)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith(str(sqlite_project.dir))
