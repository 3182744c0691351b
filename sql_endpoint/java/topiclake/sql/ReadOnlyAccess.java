package topiclake.sql;

import java.util.Collections;
import java.util.IdentityHashMap;
import java.util.Set;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.analysis.ResolvedPersistentView;
import org.apache.spark.sql.catalyst.analysis.ResolvedTable;
import org.apache.spark.sql.catalyst.catalog.CatalogTable;
import org.apache.spark.sql.catalyst.catalog.HiveTableRelation;
import org.apache.spark.sql.catalyst.expressions.CallMethodViaReflection;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.plans.logical.Command;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.SubqueryAlias;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.connector.catalog.Identifier;
import org.apache.spark.sql.execution.command.SetCommand;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.execution.datasources.v2.DataSourceV2Relation;
import scala.Function1;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * spark.sql.extensions: a check rule on every statement a JDBC user runs. The endpoint answers
 * queries (and the SHOW / DESCRIBE / SET / USE commands BI tools send); it writes nothing, because
 * topic tables are written only by the gateways, which assign their offsets. A table is read only
 * by name from the catalog and only when Access allows it; paths and reflection are refused.
 */
public class ReadOnlyAccess extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  private static final Set<String> COMMANDS = Set.of(
      "ShowNamespaces", "ShowNamespacesCommand", "ShowTables", "ShowTablesCommand", "ShowTablesExtended",
      "ShowTableExtended", "ShowViews", "ShowViewsCommand", "ShowColumns", "ShowColumnsCommand",
      "ShowTableProperties", "ShowTablePropertiesCommand", "ShowPartitions", "ShowPartitionsCommand",
      "ShowCreateTable", "ShowCreateTableCommand", "DescribeRelation", "DescribeTableCommand",
      "DescribeColumn", "DescribeColumnCommand", "DescribeNamespace", "DescribeDatabaseCommand",
      "DescribeFunction", "DescribeFunctionCommand", "ShowFunctions", "ShowFunctionsCommand", "ShowCatalogs",
      "ShowCatalogsCommand", "ShowCurrentNamespace", "ShowCurrentNamespaceCommand", "SetCatalogAndNamespace",
      "SetNamespaceCommand", "SetCatalogCommand", "SetCommand", "ResetCommand", "ExplainCommand");
  /** `<format>.`path``: a table by path, allowed only inside a folder the user may read. */
  private static final Set<String> PATH_FORMATS = Set.of("delta", "parquet", "json", "csv", "orc", "text", "avro", "binaryfile");

  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    Function1<SparkSession, Function1<LogicalPlan, BoxedUnit>> rule = session -> plan -> {
      String user = Access.user();
      if (user != null) {
        // a table read by name is a relation under an alias that names it (spark_catalog.topics.t)
        Set<LogicalPlan> named = Collections.newSetFromMap(new IdentityHashMap<>());
        plan.foreachWithSubqueries(node -> {
          checkNamed(user, (LogicalPlan) node, named);
          return BoxedUnit.UNIT;
        });
        plan.foreachWithSubqueries(node -> {
          check(user, (LogicalPlan) node, named);
          return BoxedUnit.UNIT;
        });
      }
      return BoxedUnit.UNIT;
    };
    extensions.injectCheckRule(rule);
    extensions.injectParser((session, parser) -> new UserStatementParser(session, parser));
    return BoxedUnit.UNIT;
  }

  private static boolean isRelation(LogicalPlan node) {
    return node instanceof HiveTableRelation || node instanceof LogicalRelation || node instanceof DataSourceV2Relation;
  }

  private static void checkNamed(String user, LogicalPlan node, Set<LogicalPlan> named) {
    if (node instanceof SubqueryAlias alias && isRelation(alias.child())) {
      Seq<String> qualifier = alias.identifier().qualifier();
      if (qualifier.nonEmpty()) {
        checkTable(user, CollectionConverters.asJava(qualifier), alias.identifier().name());
        named.add(alias.child());
      }
    }
  }

  /** A table named [catalog,] database, name: only in Spark's own catalog; by path, inside a readable folder. */
  private static void checkTable(String user, java.util.List<String> qualifier, String table) {
    String database = qualifier.get(qualifier.size() - 1);
    if (qualifier.size() > 2 || (qualifier.size() == 2 && !qualifier.get(0).equalsIgnoreCase("spark_catalog"))) {
      if (!Access.canRead(user, "", "")) {  // an admin: any catalog
        refuseAsMissing(String.join(".", qualifier), table);
      }
      return;
    }
    if (PATH_FORMATS.contains(database.toLowerCase(java.util.Locale.ROOT)) && table.contains("/")) {
      if (!Access.canReadPath(user, pathUri(table))) {
        throw new SecurityException("Read tables by name (topics.<name>); this path is not one of them.");
      }
      return;
    }
    if (!Access.canRead(user, database, table)) {
      refuseAsMissing(database, table);
    }
  }

  private static java.net.URI pathUri(String path) {
    try {
      return path.contains("://") ? new java.net.URI(path) : new java.io.File(path).toURI();
    } catch (java.net.URISyntaxException e) {
      throw new SecurityException("Read tables by name (topics.<name>); this path is not one of them.");
    }
  }

  private static void check(String user, LogicalPlan node, Set<LogicalPlan> named) {
    if (node instanceof Command && !COMMANDS.contains(node.getClass().getSimpleName())) {
      throw new SecurityException("The SQL endpoint answers queries only (SELECT, SHOW, DESCRIBE); "
          + node.nodeName() + " is refused. Write to topics through Kafka or HTTP.");
    }
    if (node instanceof SetCommand set && set.kv().isDefined() && set.kv().get()._2().isDefined()
        && !Access.SETTABLE.contains(set.kv().get()._1().toLowerCase(java.util.Locale.ROOT))) {
      throw new SecurityException("The SQL endpoint lets a session set only " + Access.SETTABLE + "; "
          + set.kv().get()._1() + " is refused.");
    }
    if (node instanceof ResolvedTable resolved) {  // DESCRIBE, SHOW TBLPROPERTIES ... of a table
      checkResolved(user, resolved.catalog().name(), resolved.identifier());
    } else if (node instanceof ResolvedPersistentView view) {
      checkResolved(user, view.catalog().name(), view.identifier());
    }
    for (Expression e : CollectionConverters.asJava(node.expressions())) {
      if (e.exists(x -> x instanceof CallMethodViaReflection)) {
        throw new SecurityException("reflect and java_method are refused on the SQL endpoint.");
      }
    }
    if (!isRelation(node)) {
      return;
    }
    // The folders a relation reads are checked whatever named it: a name checked as text (a path
    // with "..", or a catalog entry whose location was changed) must not reach another table's files.
    boolean files = node instanceof LogicalRelation relation && relation.relation() instanceof HadoopFsRelation;
    if (files) {
      HadoopFsRelation fs = (HadoopFsRelation) ((LogicalRelation) node).relation();
      for (Path path : CollectionConverters.asJava(fs.location().rootPaths())) {
        if (!Access.canReadPath(user, path.toUri())) {
          throw new SecurityException("Read tables by name (topics.<name>); this path is not one of them.");
        }
      }
    }
    if (named.contains(node)) {
      return;
    }
    CatalogTable t = null;
    if (node instanceof HiveTableRelation hive) {
      t = hive.tableMeta();
    } else if (node instanceof LogicalRelation relation && relation.catalogTable().isDefined()) {
      t = relation.catalogTable().get();
    } else if (files) {
      return;  // by path (a user's delta.`...`, or Delta reading a table's files): checked above
    }
    if (t == null) {
      throw new SecurityException("Read tables by name (topics.<name>); paths are refused on the SQL endpoint.");
    }
    String database = t.identifier().database().isDefined() ? t.identifier().database().get() : "default";
    if (!Access.canRead(user, database, t.identifier().table())) {
      refuseAsMissing(database, t.identifier().table());
    }
  }

  private static void checkResolved(String user, String catalog, Identifier id) {
    java.util.List<String> qualifier = new java.util.ArrayList<>();
    qualifier.add(catalog);
    qualifier.addAll(java.util.Arrays.asList(id.namespace()));
    checkTable(user, qualifier, id.name());
  }

  private static void refuseAsMissing(String database, String table) {
    // the words of a table that does not exist: a login cannot probe for the names it may not see
    throw new SecurityException("Table or view not found: " + database + "." + table);
  }
}
