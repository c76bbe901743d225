from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("workspaces", "0001_initial")]

    operations = [
        migrations.AddField(
            model_name="worker",
            name="redis_password_hash",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
    ]
