"""Commands an operator runs beside `pulumi`: `status` and `recover`."""
